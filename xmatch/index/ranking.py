"""Stages 1 and 2 of a search: candidates from a stage-1 generator, exact scores of them by
the model's pooler, and the proof (a bound) that a top-k is exact where the generator gives one.

:class:`Ranking` is the part of :class:`~xmatch.index.SearchIndex` that ranks; it reads the
index's model, side, store and engine.
"""

from __future__ import annotations

import math
import numbers
import os
import time
from typing import Any

import torch

from xmatch.index import rerank
from xmatch.index.candidates import DEFAULT_NPROBE, GENERATORS, FdeGenerator, PooledGenerator, TokenGenerator
from xmatch.index.interaction import interaction, pooled_is_exact
from xmatch.index.results import Hit, SearchResult
from xmatch.index.store import own_folder
from xmatch.model.embeddings import Embeddings

ANN_FOLDER = "ann"
#: relative float32 rounding allowed when comparing a stage-1 bound with an exact score
BOUND_TOLERANCE = 1e-5
#: the widening search over centroid lists at ``effort=1`` (both scale with ``effort``): it
#: starts at ``FIRST`` (centroid lists per query token, candidates per result asked) and
#: doubles both, per query, up to ``WIDEST``, while its stopping test fails (:meth:`Ranking._widened`)
#: The widest widths are 16 times the first: at 4 times, held-out scenes captions over 20,000
#: images ended every query unsettled at recall@10 0.73 (docs/search.md); a query that settles
#: early never reaches them, and none costs much more than scoring every item (see _widened)
FIRST_NPROBE, WIDEST_NPROBE = 8, 128
FIRST_CANDIDATES_PER_K, WIDEST_CANDIDATES_PER_K = 10, 160


#: per item, the similarities scoring it costs per query token (or per query), and whether they
#: are per query token
Widths = tuple[torch.Tensor, bool]


def default_candidates(n_items: int, k: int) -> int:
    """Candidates scored exactly per query by stage-1 generators that do not widen (``pooled``,
    ``fde``, Qdrant's): 100 (or 10 k), at most the corpus. Recall measured in docs/search.md."""
    return min(n_items, max(100, 10 * k))


def check_effort(effort: Any, candidates: int | None, nprobe: int | None) -> float:
    """``effort`` checked: None (1.0) or a number > 0, and not given together with the expert
    settings it replaces.

    Example:
        >>> check_effort(None, None, None), check_effort(2, None, None)
        (1.0, 2.0)
    """
    if effort is None:
        return 1.0
    if isinstance(effort, bool) or not isinstance(effort, numbers.Real) or not math.isfinite(effort) or effort <= 0:
        raise ValueError(f"effort must be a number > 0 (1 is the default; 2 spends about twice the work for more "
                         f"recall, 0.5 about half), got {effort!r}.")
    if candidates is not None or nprobe is not None:
        raise ValueError("effort sets the candidates and the centroid lists visited itself; give effort, or the "
                         "expert settings candidates / nprobe, not both.")
    return float(effort)


class Ranking:
    """Stages 1 and 2 of :class:`~xmatch.index.SearchIndex` (a mixin: it uses the index's
    ``model``, ``side``, ``store``, ``root``, ``engine``, ``progress`` and ``_generators``)."""

    def _ranked(self, queries: Embeddings, k: int, labels: list, candidates: int | None, exact: bool,
                stage1: str | None, nprobe: int | None, effort: float | None = None) -> list[SearchResult]:
        """The pooler's top ``k`` of each query (stages 1 and 2), with their times per query and
        the work done (:attr:`~xmatch.index.results.SearchResult.work`)."""
        effort = check_effort(effort, candidates, nprobe)
        start = time.perf_counter()
        widths = self._item_widths()
        if exact:
            results = self._exhaustive(queries, k, labels, "exhaustive", widths)
            return _timed(results, stage2=time.perf_counter() - start)
        n = len(self)
        generator = self.generator(stage1, queries, nprobe=nprobe)
        if isinstance(generator, TokenGenerator) and candidates is None and nprobe is None:
            generator.sync()
            if not generator.exact:  # centroid lists: widened per query until the estimate says stop
                return self._widened_all(queries, k, labels, generator, effort, widths)
        budget = candidates if candidates is not None else round(default_candidates(n, k) * effort)
        budget = min(n, max(k, budget))
        proposed = generator.propose(queries.to("cpu"), budget)  # stage 1 runs beside the stored tokens, on the CPU
        proposing = time.perf_counter() - start
        results: list[SearchResult | None] = [None] * len(queries)
        redo = []
        for q, rows in enumerate(proposed.rows):  # each query has its own candidates: one pooler call each
            spent = None if proposed.work is None else int(proposed.work[q])
            if proposed.bounds is None:
                scores = self._score(queries[q], rows)
                if int(torch.isfinite(scores).sum()) < k and len(rows) < n:
                    redo.append(q)  # stage 1 found fewer than k items (that score): score everything
                    continue
                top = scores.topk(k)
                work = _work(spent, queries[q], rows, widths)
                results[q] = self._result(top.values, rows[top.indices], labels[q], len(rows), False, generator.name,
                                          work, _skipped(scores))
                continue
            # a provable order needs no margin: start at 2 k, the bound says when to stop
            first = candidates if candidates is not None else 2 * k
            found = self._proven_top(queries[q], rows, proposed.bounds[q], float(proposed.floor[q]), k, first)
            if found is None:
                redo.append(q)
            else:
                top, scored, skipped = found
                work = _work(spent, queries[q], rows[:scored], widths)
                results[q] = self._result(top.values, rows[top.indices], labels[q], scored, True, generator.name,
                                          work, skipped)
        if redo:
            again = self._exhaustive(queries[torch.tensor(redo)], k, [labels[q] for q in redo], generator.name, widths)
            for q, result in zip(redo, again):
                if proposed.work is None or result.work is None:
                    result.work = None
                else:  # stage 1 ran before everything was scored
                    result.work += int(proposed.work[q])
                results[q] = result
        return _timed(results, stage1=proposing, stage2=time.perf_counter() - start - proposing)  # type: ignore[arg-type]

    def _widened_all(self, queries: Embeddings, k: int, labels: list, generator: TokenGenerator, effort: float,
                     widths: Widths | None) -> list[SearchResult]:
        """Each query widened on its own (:meth:`_widened`); the stage times are per query."""
        results, seconds = [], {"stage1": 0.0, "stage2": 0.0}
        queries = queries.to("cpu")
        for q in range(len(queries)):
            top, scored, work, extra = self._widened(generator, queries[q], k, effort, seconds)
            result = self._result(top.values, top.indices, labels[q], len(scored), len(scored) == len(self),
                                  generator.name, _work(work, queries[q], scored, widths), extra.pop("non_finite"))
            result.extra.update(extra)
            results.append(result)
        for result in results:
            result.timings.update({stage: 1000 * s / len(results) for stage, s in seconds.items()})
        return results

    def _widened(self, generator: TokenGenerator, query: Embeddings, k: int, effort: float,
                 seconds: dict[str, float]) -> tuple[Any, torch.Tensor, int, dict[str, Any]]:
        """One query over centroid lists: estimate every item, score the best-estimated
        candidates exactly, and stop when the k-th exact score beats the best estimate left
        unscored plus a slack: the largest amount by which an exact score exceeded its estimate
        among the items scored so far, plus the spread of those amounts (the items left are
        estimated worse: more of their similarities are imputed). The slack is measured per
        query, so it follows the corpus, the model and the query. Otherwise both the lists
        visited per query token and the candidates double, up to the widest allowed
        (``WIDEST_*`` times ``effort``). ``seconds`` gathers the time of each stage.

        Widening is cut short where it would cost what scoring every item does: when the next
        step (about twice the last) would bring the work there, the items not scored yet are
        scored instead and the top-k is the exact one (at most about twice the exhaustive work
        in all, on a corpus just past the exact scan; at 20,000 items and more, far less).

        Returns ``(top-k (values, rows), rows scored, stage-1 work, {"nprobe", "candidates",
        "settled"})``: ``settled`` is False where the widest widths were reached before the test
        passed (the answer may miss items; a higher ``effort`` widens further).
        """
        n = len(self)
        lists = len(generator.lists.centroids)
        nprobe = min(lists, max(1, round(FIRST_NPROBE * effort)))
        widest_nprobe = min(lists, max(nprobe, round(WIDEST_NPROBE * effort)))
        budget = min(n, max(k, round(FIRST_CANDIDATES_PER_K * k * effort)))
        widest = min(n, max(budget, round(WIDEST_CANDIDATES_PER_K * k * effort)))
        scores = torch.full((n,), -torch.inf)
        scored = torch.zeros(n, dtype=torch.bool)
        work, probed, widening = 0, 0, generator.widening(query)
        per_item = self._item_widths()[0] * int(query.lengths[0])  # similarities scoring each item costs
        whole, spent = int(per_item.sum()), 0
        while True:
            start = time.perf_counter()
            if nprobe != probed:  # at the widest lists, only the candidates grow
                approx, spent = widening.to(nprobe)
                work, probed = work + spent, nprobe
            best = approx.topk(budget).indices
            new = best[~scored[best]]
            middle = time.perf_counter()
            scores[new], scored[new] = self._score(query, new), True
            seconds["stage1"] += middle - start
            seconds["stage2"] += time.perf_counter() - middle
            top = scores.topk(k)
            settled = budget == n
            if not settled:
                error = scores[scored] - approx[scored]
                error = error[torch.isfinite(error)]  # an item left out (a non-finite score) tells nothing
                slack = (error.max() + (error.std() if len(error) > 1 else 0)) if len(error) else torch.tensor(torch.inf)
                settled = _below(approx.masked_fill(scored, -torch.inf).max() + slack, top.values[-1])
            if settled or (nprobe == widest_nprobe and budget == widest):
                break
            step, spent = work + int(per_item[scored].sum()) - spent, work + int(per_item[scored].sum())
            if spent + 2 * step >= whole:
                # the next step (about twice this one) would cost what scoring every item does:
                # score the items left instead, and the top-k is the exact one
                middle = time.perf_counter()
                rest = (~scored).nonzero()[:, 0]
                scores[rest], scored[rest] = self._score(query, rest), True
                seconds["stage2"] += time.perf_counter() - middle
                top, settled = scores.topk(k), True
                break
            nprobe, budget = min(widest_nprobe, 2 * nprobe), min(widest, 2 * budget)
        skipped = int((scored & (scores == -torch.inf)).sum())
        return top, scored.nonzero()[:, 0], work, {"nprobe": nprobe, "candidates": budget, "settled": settled,
                                                   "non_finite": skipped}

    def _proven_top(self, query: Embeddings, rows: torch.Tensor, bounds: torch.Tensor, floor: float, k: int,
                    first: int) -> tuple[Any, int, int] | None:
        """Score rows in decreasing order of their bound, doubling the batch, until no bound left
        (nor ``floor``, the bound of every row not listed) can beat the k-th exact score: the
        threshold algorithm. Returns ``(top-k, rows scored, rows that scored NaN or infinity)``,
        or None when the unlisted rows would have to be scored too (a top-k holding a left-out
        item is never proven: its k-th score is ``-inf``)."""
        done = min(first, len(rows))
        scores = self._score(query, rows[:done])
        while True:
            top = scores.topk(min(k, len(scores)))
            if len(top.values) == k:
                left = max(float(bounds[done]) if done < len(rows) else -torch.inf, floor)
                if _below(torch.tensor(left), top.values[-1]):
                    return top, done, _skipped(scores)
            if done == len(rows):
                return None
            more = rows[done : 2 * done]
            scores = torch.cat([scores, self._score(query, more)])
            done += len(more)

    def _score(self, query: Embeddings, rows: torch.Tensor) -> torch.Tensor:
        """Exact scores ``[len(rows)]`` of one query against the stored ``rows`` (stage 2); a
        non-finite score is ``-inf`` (:func:`~xmatch.index.checks.finite_scores`)."""
        return rerank.score_rows(self.model, self.side, self.store, rows, query)

    def _item_widths(self) -> Widths | None:
        """What scoring one item costs, in similarities: for token poolers, its tokens times the
        query's; for poolers of global vectors, one. None where the store does not say (a Qdrant
        collection filled by an older xmatch)."""
        if not self.model.pooler.uses_tokens:
            return torch.ones(len(self), dtype=torch.long), False
        lengths = self.store.lengths()
        return (lengths.long(), True) if lengths is not None else None

    def _exhaustive(self, queries: Embeddings, k: int, labels: list, stage1: str,
                    widths: Widths | None) -> list[SearchResult]:
        scores, rows, skipped = rerank.exhaustive_top(self.model, self.side, self.store, queries, k)
        every = torch.arange(len(self))
        return [self._result(s, r, label, len(self), True, stage1, _work(0, queries[q], every, widths), int(left))
                for q, (s, r, label, left) in enumerate(zip(scores, rows, labels, skipped))]

    def _result(self, scores: torch.Tensor, rows: torch.Tensor, label: str | None, scored: int, exact: bool,
                stage1: str, work: tuple[int, int] | None = None, non_finite: int = 0) -> SearchResult:
        """The hits of ``rows`` with their ``scores``, leaving out every ``-inf`` score (an item
        whose stored values are not finite, :func:`~xmatch.index.checks.finite_scores`);
        ``non_finite``: how many scored items were left out (reported in ``extra``)."""
        real = scores > -torch.inf
        scores, rows = scores[real], rows[real]
        rows_list = rows.tolist()
        ids, texts = self.store.ids_of(rows_list), self.store.texts(rows_list)
        hits = [Hit(i, float(s), r, t) for i, s, r, t in zip(ids, scores.tolist(), rows_list, texts)]
        spent, whole = work if work is not None else (None, None)
        extra = {"non_finite": non_finite} if non_finite else {}
        return SearchResult(hits, label, scored, len(self), exact, stage1, extra=extra, work=spent,
                            work_exhaustive=whole)

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
        if isinstance(gen, TokenGenerator):  # an expert nprobe holds for this call only
            gen.nprobe = nprobe if nprobe is not None else DEFAULT_NPROBE
        return gen

    def _default_stage1(self, inter: Any) -> str:
        """``tokens`` (``maxsim`` on Qdrant) for token poolers, ``pooled`` for global-vector ones.

        MwSr too (its sum runs over the stored item's tokens): widened centroid lists found the
        exact top-10 of hard queries where the tokens' mean found half of it (docs/search.md).
        """
        if inter is None:
            return "pooled"
        return "maxsim" if self.engine == "qdrant" else "tokens"

    def _has_pooled(self, queries: Embeddings | None) -> bool:
        stored = self.store.has_pooled()
        return stored and (queries is None or queries.pooled is not None)

    def _make_generator(self, name: str, inter: Any, key: str) -> Any:
        if self.engine == "qdrant":
            from xmatch.index.qdrant import QdrantGenerator

            return QdrantGenerator(self.store, name, inter, self.side, exact_pooled=pooled_is_exact(self.model.pooler))
        if name not in GENERATORS:
            raise ValueError(f"unknown stage-1 generator {name!r} for the FAISS engine; generators: {', '.join(GENERATORS)}.")
        folder, writable = own_folder(self.root, ANN_FOLDER, create=False), os.access(self.root, os.W_OK)
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



def _work(stage1: int | None, query: Embeddings, scored: torch.Tensor, widths: Widths | None) -> tuple[int, int] | None:
    """``(work of stages 1 and 2, work of scoring every item)`` of one query (a one-item
    ``Embeddings``), in similarities; None where it is not known."""
    if stage1 is None or widths is None:
        return None
    per_item, per_query = widths
    width = int(query.lengths[0]) if per_query else 1
    return stage1 + width * int(per_item[scored].sum()), width * int(per_item.sum())


def _timed(results: list[SearchResult], **seconds: float) -> list[SearchResult]:
    """Record each stage's time per query (milliseconds) in every result of one call."""
    for result in results:
        result.timings.update({stage: 1000 * s / len(results) for stage, s in seconds.items()})
    return results




def _skipped(scores: torch.Tensor) -> int:
    """How many of ``scores`` were left out as not finite (``-inf``, :meth:`Ranking._score`)."""
    return int((scores == -torch.inf).sum())


def _below(bound: torch.Tensor, kth: torch.Tensor) -> bool:
    """Whether no unscored item can beat the k-th exact score: at most a tie within float
    rounding (the bound and the score are float32 sums of the same products)."""
    kth = float(kth)
    return float(bound) <= kth + BOUND_TOLERANCE * max(1.0, abs(kth))


