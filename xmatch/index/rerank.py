"""Stage 2: exact scores with the model's own pooler, on candidates or on the whole corpus.

A score that is NaN or infinite (an item whose stored values are not, written before ``add``
refused them or damaged on disk) is made ``-inf``, so it never ranks above a real score; the
ranking leaves such items out of the hits and counts them (``result.extra["non_finite"]``).
"""

from __future__ import annotations

from typing import Protocol

import torch

from xmatch.index.checks import finite_scores
from xmatch.model.embeddings import Embeddings
from xmatch.model.model import MatchingModel


class TokenSource(Protocol):
    """What stage 2 reads from a store (:class:`~xmatch.index.store.ShardStore`, the Qdrant store)."""

    def __len__(self) -> int: ...

    def gather(self, rows: torch.Tensor) -> Embeddings: ...

    def blocks(self, first: int = 0): ...

    def boxes(self, rows: torch.Tensor) -> torch.Tensor | None: ...


def scores(model: MatchingModel, side: str, items: Embeddings, queries: Embeddings) -> torch.Tensor:
    """``[n_items, n_queries]`` exact scores, the stored items on whichever side they belong
    (``-inf`` where a score is not finite)."""
    items = items.to(model.device, model.dtype)
    queries = queries.to(model.device, model.dtype)
    with torch.inference_mode():
        if side == "images":
            return finite_scores(model.similarity(items, queries).float().cpu())
        return finite_scores(model.similarity(queries, items).T.float().cpu())


def score_rows(model: MatchingModel, side: str, store: TokenSource, rows: torch.Tensor, query: Embeddings) -> torch.Tensor:
    """Exact scores ``[len(rows)]`` of one query against the stored ``rows``."""
    if not len(rows):
        return torch.zeros(0)
    return scores(model, side, store.gather(rows), query)[:, 0]


def exhaustive_top(
    model: MatchingModel, side: str, store: TokenSource, queries: Embeddings, k: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The exact top-k of every query over the whole corpus: ``(scores [Q, k], rows [Q, k],
    items that scored NaN or infinity [Q])`` (those score ``-inf``).

    The corpus is scored block by block (a shard at a time) against all queries at once, and
    a running top-k is kept, so memory stays bounded whatever the corpus size.
    """
    best = torch.full((len(queries), 0), -torch.inf)
    rows = torch.zeros((len(queries), 0), dtype=torch.long)
    left_out = torch.zeros(len(queries), dtype=torch.long)
    for start, block in store.blocks():
        s = scores(model, side, block, queries).T  # [Q, n_block]
        left_out += (s == -torch.inf).sum(dim=1)
        best = torch.cat([best, s], dim=1)
        rows = torch.cat([rows, torch.arange(start, start + s.shape[1]).expand(len(queries), -1)], dim=1)
        top = best.topk(min(k, best.shape[1]), dim=1)
        best, rows = top.values, torch.gather(rows, 1, top.indices)
    return best, rows, left_out
