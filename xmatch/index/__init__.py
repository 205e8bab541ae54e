"""Search: index a corpus once, query it in milliseconds, exact where it counts.

A corpus of images (or captions) is encoded once by a model and kept on disk as token sets
(:mod:`xmatch.index.store`); a query is answered in two stages: candidates from an approximate
nearest-neighbour structure, then exact scores with the model's own pooler
(:mod:`xmatch.index.search`); optionally a third, the model's verifier head re-scoring the top K
(:mod:`xmatch.index.verifier`). The embedded engine is FAISS; the same API targets Qdrant
(:mod:`xmatch.index.qdrant`). See docs/search.md.

Example:
    >>> import xmatch.index
    >>> index = xmatch.index.open("idx")  # needs an index built with `xmatch index`  # doctest: +SKIP
    >>> for hit in index.search_texts(["a large red circle left of a small blue seven"], k=5)[0].hits:  # doctest: +SKIP
    ...     print(hit.id, round(hit.score, 3))
"""

from __future__ import annotations

from xmatch.index.cascade import Cascade
from xmatch.index.errors import (
    DamagedIndexError,
    EmptyIndexError,
    ModelMismatchError,
    NoVerifierError,
    SearchIndexError,
    WrongSideError,
)
from xmatch.model.fingerprint import model_fingerprint
from xmatch.index.results import Hit, SearchResult
from xmatch.index.ranking import default_candidates
from xmatch.index.search import SearchIndex, create, open

__all__ = [
    "Cascade", "DamagedIndexError", "EmptyIndexError", "Hit", "ModelMismatchError", "NoVerifierError", "SearchIndex",
    "SearchIndexError", "SearchResult", "WrongSideError", "create", "default_candidates",
    "model_fingerprint", "open",
]
