"""Stages 1 and 2 of a search: candidates from a stage-1 generator, exact scores of them by
the model's pooler, and the proof (a bound) that a top-k is exact where the generator gives one.

:class:`Ranking` is the part of :class:`~xmatch.index.SearchIndex` that ranks; it reads the
index's model, side, store and engine.
"""

from __future__ import annotations

import os
import time
from typing import Any

import torch

from xmatch.index import ann, rerank
from xmatch.index.candidates import GENERATORS, FdeGenerator, PooledGenerator, TokenGenerator
from xmatch.index.interaction import interaction, pooled_is_exact
from xmatch.index.results import Hit, SearchResult
from xmatch.model.embeddings import Embeddings

ANN_FOLDER = "ann"
#: relative float32 rounding allowed when comparing a stage-1 bound with an exact score
BOUND_TOLERANCE = 1e-5


def default_candidates(n_items: int, k: int) -> int:
    """Candidates scored exactly per query by default: 100 (or 10 k), at most the corpus. The
    recall@10 measured at this setting is in docs/search.md."""
    return min(n_items, max(100, 10 * k))



class Ranking:
    """Stages 1 and 2 of :class:`~xmatch.index.SearchIndex` (a mixin: it uses the index's
    ``model``, ``side``, ``store``, ``root``, ``engine``, ``progress`` and ``_generators``)."""

    def _ranked(self, queries: Embeddings, k: int, labels: list, candidates: int | None, exact: bool,
                stage1: str | None, nprobe: int | None) -> list[SearchResult]:
        """The pooler's top ``k`` of each query (stages 1 and 2), with their times per query."""
        start = time.perf_counter()
        if exact:
            results = self._exhaustive(queries, k, labels, "exhaustive")
            return _timed(results, stage2=time.perf_counter() - start)
        n = len(self)
        generator = self.generator(stage1, queries, nprobe=nprobe)
        budget = min(n, max(k, candidates if candidates is not None else default_candidates(n, k)))
        proposed = generator.propose(queries.to("cpu"), budget)  # stage 1 runs beside the stored tokens, on the CPU
        proposing = time.perf_counter() - start
        results: list[SearchResult | None] = [None] * len(queries)
        redo = []
        for q, rows in enumerate(proposed.rows):  # each query has its own candidates: one pooler call each
            if proposed.bounds is None:
                scores = rerank.score_rows(self.model, self.side, self.store, rows, queries[q])
                if len(scores) < k:
                    redo.append(q)  # stage 1 found fewer than k items: score everything
                    continue
                top = scores.topk(k)
                results[q] = self._result(top.values, rows[top.indices], labels[q], len(rows), False, generator.name)
                continue
            # a provable order needs no margin: start at 2 k, the bound says when to stop
            first = candidates if candidates is not None else 2 * k
            found = self._proven_top(queries[q], rows, proposed.bounds[q], float(proposed.floor[q]), k, first)
            if found is None:
                redo.append(q)
            else:
                top, scored = found
                results[q] = self._result(top.values, rows[top.indices], labels[q], scored, True, generator.name)
        if redo:
            again = self._exhaustive(queries[torch.tensor(redo)], k, [labels[q] for q in redo], generator.name)
            for q, result in zip(redo, again):
                results[q] = result
        return _timed(results, stage1=proposing, stage2=time.perf_counter() - start - proposing)  # type: ignore[arg-type]

    def _proven_top(self, query: Embeddings, rows: torch.Tensor, bounds: torch.Tensor, floor: float, k: int,
                    first: int) -> tuple[Any, int] | None:
        """Score rows in decreasing order of their bound, doubling the batch, until no bound left
        (nor ``floor``, the bound of every row not listed) can beat the k-th exact score: the
        threshold algorithm. Returns ``(top-k, rows scored)``, or None when the unlisted rows
        would have to be scored too."""
        done = min(first, len(rows))
        scores = rerank.score_rows(self.model, self.side, self.store, rows[:done], query)
        while True:
            top = scores.topk(min(k, len(scores)))
            if len(top.values) == k:
                left = max(float(bounds[done]) if done < len(rows) else -torch.inf, floor)
                if _below(torch.tensor(left), top.values[-1]):
                    return top, done
            if done == len(rows):
                return None
            more = rows[done : 2 * done]
            scores = torch.cat([scores, rerank.score_rows(self.model, self.side, self.store, more, query)])
            done += len(more)

    def _exhaustive(self, queries: Embeddings, k: int, labels: list, stage1: str) -> list[SearchResult]:
        scores, rows = rerank.exhaustive_top(self.model, self.side, self.store, queries, k)
        return [self._result(s, r, label, len(self), True, stage1) for s, r, label in zip(scores, rows, labels)]

    def _result(self, scores: torch.Tensor, rows: torch.Tensor, label: str | None, scored: int, exact: bool,
                stage1: str) -> SearchResult:
        rows_list = rows.tolist()
        ids, texts = self.store.ids_of(rows_list), self.store.texts(rows_list)
        hits = [Hit(i, float(s), r, t) for i, s, r, t in zip(ids, scores.tolist(), rows_list, texts)]
        return SearchResult(hits, label, scored, len(self), exact, stage1)

    def generator(self, name: str | None, queries: Embeddings | None = None, *, nprobe: int | None = None) -> Any:
        """The stage-1 generator ``name`` (default: the pooler's), built or loaded on first use."""
        inter = interaction(self.model.pooler, self.model.spec.get("pooler", {}).get("name"))
        if name is None:
            name = self._default_stage1(inter)
        key = name
        if name == "pooled":
            # the global vectors rank for poolers that score them (TERN); a token pooler's
            # candidates come from the tokens' mean (its global slot, if any, is not scored)
            source = "pooled" if inter is None and self._has_pooled(queries) else "mean"
            key = f"pooled:{source}"
        if key not in self._generators:
            self._generators[key] = self._make_generator(name, inter, key)
        gen = self._generators[key]
        if nprobe is not None:
            gen.nprobe = nprobe
        return gen

    def _default_stage1(self, inter: Any) -> str:
        """``tokens`` (``maxsim`` on Qdrant) for token poolers, ``pooled`` for global-vector ones.

        One exception, measured (docs/search.md): a pooler whose only sum runs over the stored
        item's tokens (MwSr for text queries) gets ``pooled`` (the tokens' mean) once the corpus
        is past the exact token scan; the centroid estimate of such sums is weaker.
        """
        if inter is None:
            return "pooled"
        if self.engine == "qdrant":
            return "maxsim"
        query_sum = inter.text_sum if self.side == "images" else inter.image_sum
        if not query_sum and int(self.store.lengths().sum()) > ann.FLAT_LIMIT:
            return "pooled"
        return "tokens"

    def _has_pooled(self, queries: Embeddings | None) -> bool:
        stored = self.store.has_pooled()
        return stored and (queries is None or queries.pooled is not None)

    def _make_generator(self, name: str, inter: Any, key: str) -> Any:
        if self.engine == "qdrant":
            from xmatch.index.qdrant import QdrantGenerator

            return QdrantGenerator(self.store, name, inter, self.side, exact_pooled=pooled_is_exact(self.model.pooler))
        if name not in GENERATORS:
            raise ValueError(f"unknown stage-1 generator {name!r} for the FAISS engine; generators: {', '.join(GENERATORS)}.")
        folder, writable = self.root / ANN_FOLDER, os.access(self.root, os.W_OK)
        common = {"writable": writable, "progress": self.progress}
        if name == "pooled":
            source = key.split(":", 1)[1]
            exact = pooled_is_exact(self.model.pooler) and source == "pooled"
            return PooledGenerator(self.store, folder, source=source, exact_scores=exact, **common)
        if inter is None:
            raise ValueError(f"the pooler {type(self.model.pooler).__name__} reads only global vectors; use stage1='pooled'.")
        if name == "fde":
            return FdeGenerator(self.store, folder, inter, self.side, **common)
        return TokenGenerator(self.store, folder, inter, self.side, **common)



def _timed(results: list[SearchResult], **seconds: float) -> list[SearchResult]:
    """Record each stage's time per query (milliseconds) in every result of one call."""
    for result in results:
        result.timings.update({stage: 1000 * s / len(results) for stage, s in seconds.items()})
    return results




def _below(bound: torch.Tensor, kth: torch.Tensor) -> bool:
    """Whether no unscored item can beat the k-th exact score: at most a tie within float
    rounding (the bound and the score are float32 sums of the same products)."""
    kth = float(kth)
    return float(bound) <= kth + BOUND_TOLERANCE * max(1.0, abs(kth))


