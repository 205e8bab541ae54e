"""Errors of the dataset readers: every message names the file and what was expected."""

from __future__ import annotations

from xmatch.core.errors import XmatchError


class DataError(XmatchError, ValueError):
    """A dataset file that is malformed, inconsistent or corrupt (the message names it)."""


class DataFileNotFoundError(DataError, FileNotFoundError):
    """A file or folder a dataset layout needs is missing (the message names the path)."""
