"""A cascade of two models: one shortlists cheaply, the other re-ranks the shortlist exactly.

The TERAN paper (Messina et al., ACM TOMM 2021, Sec. 6) suggests it for large-scale retrieval:
TERN's global vectors (one inner product per item, a FAISS search) choose the few hundred
items worth TERAN's fine-grained alignment. Both indexes hold the same items under the same
ids (built from the same data); each is queried with its own model. With ``rerank=K`` the
second model's verifier head re-scores the top K (:mod:`xmatch.index.verifier`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch

from xmatch.model.embeddings import Embeddings
from xmatch.model.inputs import ImageInputs
from xmatch.index import rerank, verifier
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

    def search_texts(self, texts: Sequence[str], k: int = 10, *, rerank: int | None = None,
                     rerank_batch: int = verifier.DEFAULT_BATCH, **first_options: Any) -> list[SearchResult]:
        """Text-to-image search: shortlist with the first model, re-rank with the second.

        ``rerank`` and ``rerank_batch``: the second model's verifier stage, as in
        :meth:`SearchIndex.search`; ``first_options`` go to the first index's
        :meth:`~SearchIndex.search` (``exact``, ``candidates``, ...)."""
        depth = self._depth(k, rerank, rerank_batch)
        shortlists = self.first.search_texts(texts, k=self._size(depth), **first_options)
        start = time.perf_counter()
        with torch.inference_mode():
            queries = self.second.model.encode_texts(list(texts))
        return self._verified(self._rerank(shortlists, queries, depth, start), queries, k, rerank, rerank_batch)

    def search_images(self, inputs: ImageInputs, k: int = 10, *, rerank: int | None = None,
                      rerank_batch: int = verifier.DEFAULT_BATCH, **first_options: Any) -> list[SearchResult]:
        """Image-to-text search over caption indexes: ``inputs`` as
        :meth:`SearchIndex.search_images` takes them (:class:`~xmatch.PixelInputs` or
        :class:`~xmatch.RegionInputs`); ``rerank`` as in :meth:`search_texts`; ``first_options``
        go to the first index's search."""
        depth = self._depth(k, rerank, rerank_batch)
        shortlists = self.first.search_images(inputs, k=self._size(depth), **first_options)
        start = time.perf_counter()
        with torch.inference_mode():
            queries = self.second.model.encode_images(inputs)
        return self._verified(self._rerank(shortlists, queries, depth, start), queries, k, rerank, rerank_batch)

    def _depth(self, k: int, rerank: int | None, batch_size: int) -> int:
        """How deep the second model ranks: ``k``, or the verifier's top when deeper."""
        if rerank is None:
            return k
        verifier.check(self.second.model, rerank, self.second.root, batch_size)
        return min(len(self.second), max(k, rerank))

    def _size(self, k: int) -> int:
        return min(len(self.first), max(k, self.shortlist))

    def _rerank(self, shortlists: list[SearchResult], queries: Embeddings, depth: int, start: float) -> list[SearchResult]:
        """The second model's top ``depth`` of each shortlist (``start``: when its queries' encoding began)."""
        out = []
        for q, short in enumerate(shortlists):  # each query has its own shortlist: one pooler call each
            try:
                rows = torch.tensor(self.second.store.row_of(short.ids), dtype=torch.long)
            except KeyError as exc:
                raise SearchIndexError(f"{exc.args[0]} The cascade's indexes must hold the same ids.") from None
            scores = rerank.score_rows(self.second.model, self.second.side, self.second.store, rows, queries[q])
            top = scores.topk(min(depth, len(scores)))
            result = self.second._result(top.values, rows[top.indices], short.query, len(rows), False, "cascade")
            result.extra = {"shortlist_scored": short.scored}
            out.append(result)
        per_query = 1000 * (time.perf_counter() - start) / max(1, len(out))
        for result, short in zip(out, shortlists):
            result.timings = {"shortlist": sum(short.timings.values()), "cascade": per_query}
        return out

    def _verified(self, results: list[SearchResult], queries: Embeddings, k: int, top: int | None,
                  batch_size: int) -> list[SearchResult]:
        """The second model's verifier re-scores each result's first ``top`` hits (none: as they are)."""
        if top is None:
            return results
        second = self.second
        return verifier.rerank_results(second.model, second.side, second.store, queries, results, top, k, batch_size)
