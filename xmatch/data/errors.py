"""Errors of the dataset readers: every message names the file and what was expected."""

from __future__ import annotations

from xmatch.core.errors import XmatchError


class DataError(XmatchError, ValueError):
    """A dataset file that is malformed, inconsistent or corrupt (the message names it)."""


class DataFileNotFoundError(DataError, FileNotFoundError):
    """A file or folder a dataset layout needs is missing (the message names the path)."""


class NoCaptionsError(DataError):
    """Images of the split have no captions (a folder extracted without ``--captions``): they
    can be read alone (``captions_per_image=0``) to index them for text search, not trained or
    evaluated on.

    Attributes:
        missing: the images without captions.
        total: the images of the split.
    """

    def __init__(self, message: str, missing: int, total: int) -> None:
        super().__init__(message)
        self.missing = missing
        self.total = total
