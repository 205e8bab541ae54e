"""Stage 3: a cross-attention verifier re-scores the top of the late-interaction ranking.

Stage 2 (:mod:`xmatch.index.rerank`) ranks the candidates with the model's pooler. A model with
a verifier head (``model.verifier``: a matching head in the manner of ALBEF and BLIP) reads each
(query, item) pair of a query's top ``K`` with cross-attention and gives a match logit
(``model.verify``); those ``K`` hits come back in the verifier's order, above the rest, which
keep the pooler's. The verifier reads the token sets the index stores (nothing is encoded
again), with their region boxes where the index keeps them. Hits keep the pooler's score in
``score``; the verifier's logit is ``verifier``, so the pooler's figures stay comparable.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from xmatch.model.embeddings import Embeddings
from xmatch.model.model import MatchingModel
from xmatch.index.checks import finite_scores
from xmatch.index.errors import NoVerifierError
from xmatch.index.rerank import TokenSource
from xmatch.index.results import VERIFIER, SearchResult

#: (query, item) pairs per verifier call
DEFAULT_BATCH = 256


def check(model: MatchingModel, rerank: int, root: Path | str, batch_size: int = DEFAULT_BATCH) -> None:
    """Refuse a re-ranking the model cannot do, before any stage runs.

    Raises:
        ValueError: ``rerank`` or ``batch_size`` is not a whole number of at least 1.
        NoVerifierError: the model has no verifier head (naming the index and the fix).

    Example:
        >>> check(xmatch.build("teran-mrsw-scenes"), 0, "idx")
        Traceback (most recent call last):
        ...
        ValueError: rerank must be at least 1 (the pooler's top hits re-scored by the verifier per query), got 0.
    """
    for name, value, what in (("rerank", rerank, "the pooler's top hits re-scored by the verifier per query"),
                              ("rerank batch", batch_size, "(query, item) pairs per verifier call")):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be at least 1 ({what}), got {value!r}.")
    if getattr(model, "verifier", None) is None:
        raise NoVerifierError(
            f"rerank needs a model with a verifier head, and the model of the index {root} has none: index the "
            "corpus with a model that has one (xmatch index MODEL --out NEW_INDEX, MODEL built with a trained "
            "[verifier] table), or search without rerank."
        )


def logits(
    model: MatchingModel,
    side: str,
    store: TokenSource,
    queries: Embeddings,
    rows: list[torch.Tensor],
    batch_size: int = DEFAULT_BATCH,
) -> list[torch.Tensor]:
    """The verifier's logit of every query against its stored ``rows``: ``[len(rows[q])]`` each.

    The pairs of every query are put in one list and scored ``batch_size`` at a time, whatever
    the number of queries and of rows per query.
    """
    owner = torch.cat([torch.full((len(r),), q, dtype=torch.long) for q, r in enumerate(rows)])
    flat = torch.cat([torch.as_tensor(r, dtype=torch.long) for r in rows])
    out = torch.empty(len(flat))
    for start in range(0, len(flat), batch_size):
        part = slice(start, start + batch_size)
        items, asked = stored(store, flat[part]), queries[owner[part].to(queries.tokens.device)]
        img, txt = (items, asked) if side == "images" else (asked, items)
        img = img.trimmed().to(model.device, model.dtype)
        txt = txt.trimmed().to(model.device, model.dtype)
        with torch.inference_mode():
            out[part] = model.verify(img, txt, batch_size=batch_size).float().cpu()
    return list(out.split([len(r) for r in rows]))


def stored(store: TokenSource, rows: torch.Tensor) -> Embeddings:
    """The stored token sets of ``rows`` with their region boxes, where the index keeps them
    (None otherwise: caption indexes, grids without boxes)."""
    e = store.gather(rows)
    boxes = store.boxes(rows)
    if boxes is None:
        return e
    width = e.tokens.shape[1]
    boxes = torch.nn.functional.pad(boxes[:, :width], (0, 0, 0, max(0, width - boxes.shape[1])))
    return Embeddings(e.tokens, e.mask, e.pooled, boxes)


def rerank_results(
    model: MatchingModel,
    side: str,
    store: TokenSource,
    queries: Embeddings,
    results: list[SearchResult],
    rerank: int,
    k: int,
    batch_size: int = DEFAULT_BATCH,
) -> list[SearchResult]:
    """Re-score each result's first ``rerank`` hits with the verifier, put them first in its
    order (ties keep the pooler's), keep the rest in the pooler's, and cut to ``k`` hits.

    ``results`` are the pooler's rankings of ``queries`` (at least ``min(rerank, k)`` deep);
    each gets ``reranked`` and the ``verifier`` time per query in ``timings``.
    """
    start = time.perf_counter()
    tops = [torch.tensor([h.row for h in r.hits[:rerank]], dtype=torch.long) for r in results]
    scored = logits(model, side, store, queries, tops, batch_size)
    per_query = 1000 * (time.perf_counter() - start) / max(1, len(results))
    for result, logit in zip(results, scored):
        top = result.hits[: len(logit)]
        for hit, value in zip(top, logit.tolist()):
            hit.verifier, hit.stage = value, VERIFIER
        # a non-finite logit sorts last, never first (a NaN would lead a descending sort)
        order = torch.sort(finite_scores(logit), descending=True, stable=True).indices.tolist()
        result.hits = ([top[i] for i in order] + result.hits[len(logit):])[:k]
        result.reranked = len(logit)
        result.timings["verifier"] = per_query
    return results
