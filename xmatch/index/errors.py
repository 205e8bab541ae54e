"""Errors of the search index: each names the index or file at fault and what to do about it."""

from __future__ import annotations

from xmatch.core.errors import XmatchError


class SearchIndexError(XmatchError, ValueError):
    """Base class of the search-index errors (a ``ValueError``, so the command line prints it
    as one line)."""


class DamagedIndexError(SearchIndexError):
    """An index file is missing, truncated or altered (the message names the file)."""


class ModelMismatchError(SearchIndexError):
    """The query model is not the model the index was built with (different encoders or weights)."""


class EmptyIndexError(SearchIndexError):
    """A search on an index that holds no items yet."""


class WrongSideError(SearchIndexError):
    """A query of the same modality as the indexed items (texts against a caption index)."""


class NoVerifierError(SearchIndexError):
    """A verifier re-ranking (``rerank``) asked of a model without a verifier head."""
