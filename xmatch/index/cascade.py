"""A cascade of two models: one shortlists cheaply, the other re-ranks the shortlist exactly.

The TERAN paper (Messina et al., ACM TOMM 2021, Sec. 6) suggests it for large-scale retrieval:
TERN's global vectors (one inner product per item, a FAISS search) choose the few hundred
items worth TERAN's fine-grained alignment. Both indexes hold the same items under the same
ids (built from the same data); each is queried with its own model.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from xmatch.model.embeddings import Embeddings
from xmatch.model.inputs import ImageInputs
from xmatch.index import rerank
from xmatch.index.errors import SearchIndexError
from xmatch.index.results import SearchResult
from xmatch.index.search import SearchIndex


class Cascade:
    """Shortlist with ``first``'s model, re-rank with ``second``'s.

    Args:
        first: the shortlisting index (e.g. built with ``tern-scenes``).
        second: the re-ranking index (e.g. built with ``teran-mrsw-scenes``), same items and ids.
        shortlist: items handed from the first model to the second per query.

    Example:
        >>> cascade = Cascade(xmatch.index.open("idx-tern"), xmatch.index.open("idx-teran"), shortlist=200)  # needs two built indexes  # doctest: +SKIP
        >>> cascade.search_texts(["a red circle left of a blue seven"], k=5)[0].ids  # doctest: +SKIP
    """

    def __init__(self, first: SearchIndex, second: SearchIndex, shortlist: int = 1000) -> None:
        if first.side != second.side:
            raise SearchIndexError(f"a cascade needs two indexes of the same items; {first.root} holds "
                                   f"{first.side}, {second.root} holds {second.side}.")
        if len(first) != len(second):
            raise SearchIndexError(f"{first.root} holds {len(first)} items but {second.root} holds {len(second)}; "
                                   "build both indexes from the same data.")
        if shortlist < 1:
            raise ValueError(f"shortlist must be at least 1, got {shortlist}.")
        self.first, self.second, self.shortlist = first, second, shortlist

    def search_texts(self, texts: Sequence[str], k: int = 10, **first_options: Any) -> list[SearchResult]:
        """Text-to-image search: shortlist with the first model, re-rank with the second.

        ``first_options`` go to the first index's :meth:`~SearchIndex.search` (``exact``,
        ``candidates``, ...)."""
        shortlists = self.first.search_texts(texts, k=self._size(k), **first_options)
        with torch.inference_mode():
            queries = self.second.model.encode_texts(list(texts))
        return self._rerank(shortlists, queries, k)

    def search_images(self, inputs: ImageInputs, k: int = 10, **first_options: Any) -> list[SearchResult]:
        """Image-to-text search over caption indexes: ``inputs`` as
        :meth:`SearchIndex.search_images` takes them (:class:`~xmatch.PixelInputs` or
        :class:`~xmatch.RegionInputs`); ``first_options`` go to the first index's search."""
        shortlists = self.first.search_images(inputs, k=self._size(k), **first_options)
        with torch.inference_mode():
            queries = self.second.model.encode_images(inputs)
        return self._rerank(shortlists, queries, k)

    def _size(self, k: int) -> int:
        return min(len(self.first), max(k, self.shortlist))

    def _rerank(self, shortlists: list[SearchResult], queries: Embeddings, k: int) -> list[SearchResult]:
        out = []
        for q, short in enumerate(shortlists):  # each query has its own shortlist: one pooler call each
            try:
                rows = torch.tensor(self.second.store.row_of(short.ids), dtype=torch.long)
            except KeyError as exc:
                raise SearchIndexError(f"{exc.args[0]} The cascade's indexes must hold the same ids.") from None
            scores = rerank.score_rows(self.second.model, self.second.side, self.second.store, rows, queries[q])
            top = scores.topk(min(k, len(scores)))
            result = self.second._result(top.values, rows[top.indices], short.query, len(rows), False, "cascade")
            result.extra = {"shortlist_scored": short.scored}
            out.append(result)
        return out
