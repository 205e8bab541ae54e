"""Retrieval metrics of the papers: ranks, Recall@K, median/mean rank, NDCG@25.

Everything follows the original TERAN ``evaluation.py`` / ``evaluate_utils/dcg.py``
(REFERENCE.md B7-B8): rankings are ``argsort(scores)[::-1]`` (numpy's order for ties),
caption k belongs to image ``k // captions_per_image``, R@K = 100 * mean(rank < K),
medr = floor(median(rank)) + 1, meanr = mean(rank) + 1, NDCG uses exponential gains
``2^rel - 1`` on the top 25.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

RECALL_AT = (1, 5, 10)


@dataclass
class DirectionResult:
    """Per-query outcome of one retrieval direction.

    Attributes:
        ranks: ``[Q]`` 0-based rank of the (best) ground truth.
        top: ``[Q, k]`` indices of the top-ranked items.
        ndcg: ``{relevance name: [Q]}`` NDCG@25 per query.
    """

    ranks: np.ndarray
    top: np.ndarray
    ndcg: dict[str, np.ndarray] = field(default_factory=dict)


def _orders(scores: np.ndarray) -> np.ndarray:
    # numpy's argsort reversed, row by row, exactly as the original ranks (same ties)
    return np.argsort(scores, axis=1)[:, ::-1]


def _positions(order: np.ndarray) -> np.ndarray:
    positions = np.empty_like(order)
    rows = np.arange(order.shape[0])[:, None]
    positions[rows, order] = np.arange(order.shape[1])[None, :]
    return positions


def dcg_at(relevance: np.ndarray, ranking: np.ndarray) -> np.ndarray:
    """DCG of each row's ``ranking`` (indices into that row of ``relevance``)."""
    gains = np.power(2.0, np.take_along_axis(relevance, ranking, axis=1)) - 1.0
    discounts = np.log2(np.arange(ranking.shape[1]) + 2.0)
    return (gains / discounts).sum(axis=1)


def ndcg_at(relevance: np.ndarray, ranking: np.ndarray) -> np.ndarray:
    """NDCG of each row: DCG of the ranking over DCG of the ideal order (0 where that is 0)."""
    k = ranking.shape[1]
    ideal = dcg_at(relevance, _orders(relevance)[:, :k])
    dcg = dcg_at(relevance, ranking)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(ideal > 0, dcg / np.where(ideal > 0, ideal, 1.0), 0.0)


def image_to_text(
    scores: np.ndarray,
    captions_per_image: int = 5,
    relevance: dict[str, np.ndarray] | None = None,
    ndcg_k: int = 25,
) -> DirectionResult:
    """Sentence retrieval: one query per image (rows of ``scores [N, cN]``).

    ``relevance[name]`` is ``[cN, N]`` (caption, image), the original layout; the relevance of
    caption q for image n is ``relevance[q, n]``.
    """
    n_img, n_cap = scores.shape
    if n_cap != captions_per_image * n_img:
        raise ValueError(
            f"scores are {scores.shape} but {captions_per_image} captions per image need "
            f"{captions_per_image * n_img} columns."
        )
    order = _orders(scores)
    own = (np.arange(n_img)[:, None] * captions_per_image + np.arange(captions_per_image)[None]).astype(np.int64)
    ranks = np.take_along_axis(_positions(order), own, axis=1).min(axis=1).astype(np.float64)
    ndcg = {name: ndcg_at(rel.T.astype(np.float64), order[:, :ndcg_k]) for name, rel in (relevance or {}).items()}
    return DirectionResult(ranks, order[:, :1], ndcg)


def text_to_image(
    scores: np.ndarray,
    captions_per_image: int = 5,
    relevance: dict[str, np.ndarray] | None = None,
    ndcg_k: int = 25,
    keep_top: int = 50,
) -> DirectionResult:
    """Image retrieval: one query per caption (columns of ``scores [N, cN]``)."""
    n_img, n_cap = scores.shape
    if n_cap != captions_per_image * n_img:
        raise ValueError(
            f"scores are {scores.shape} but {captions_per_image} captions per image need "
            f"{captions_per_image * n_img} columns."
        )
    order = _orders(np.ascontiguousarray(scores.T))
    truth = np.arange(n_cap) // captions_per_image
    ranks = _positions(order)[np.arange(n_cap), truth].astype(np.float64)
    ndcg = {name: ndcg_at(rel.astype(np.float64), order[:, :ndcg_k]) for name, rel in (relevance or {}).items()}
    return DirectionResult(ranks, order[:, :keep_top], ndcg)


def summarize(result: DirectionResult, exclude_zero_ndcg: bool) -> dict[str, float]:
    """R@1/5/10, medr, meanr and mean NDCG per relevance.

    ``exclude_zero_ndcg``: the original averages sentence-retrieval NDCG over non-zero values
    only (``ndcgs != 0``) and image-retrieval NDCG over every query; pass True for i2t to match.
    """
    ranks = result.ranks
    out = {f"r{k}": 100.0 * float(np.mean(ranks < k)) for k in RECALL_AT}
    out["medr"] = float(np.floor(np.median(ranks)) + 1)
    out["meanr"] = float(ranks.mean() + 1)
    for name, values in result.ndcg.items():
        kept = values[values != 0] if exclude_zero_ndcg else values
        out[f"ndcg_{name}"] = float(kept.mean()) if kept.size else 0.0
    return out
