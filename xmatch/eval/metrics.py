"""Retrieval metrics of the papers: ranks, Recall@K, median/mean rank, NDCG@25.

Everything follows the original TERAN ``evaluation.py`` / ``evaluate_utils/dcg.py``
(REFERENCE.md B7-B8): rankings are ``argsort(scores)[::-1]`` (numpy's order for ties),
caption k belongs to image ``k // captions_per_image``, R@K = 100 * mean(rank < K),
medr = floor(median(rank)) + 1, meanr = mean(rank) + 1, NDCG uses exponential gains
``2^rel - 1`` on the top 25.
"""

from __future__ import annotations

from collections.abc import Iterator
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


def _top_orders(scores: np.ndarray, k: int) -> np.ndarray:
    """The first ``k`` columns of :func:`_orders` without sorting whole rows.

    Where a row's ``k + 1`` largest scores are distinct, its first ``k`` are those scores in
    descending order whatever the sort, so a partition and a sort of ``k + 1`` values per row
    give them. A row with a tie there takes the full argsort, whose tie order (numpy's, the
    original code's) no shortcut can reproduce.
    """
    n = scores.shape[1]
    if k + 1 >= n:
        return _orders(scores)[:, :k]
    top = np.argpartition(scores, n - k - 1, axis=1)[:, n - k - 1 :]
    values = np.take_along_axis(scores, top, axis=1)
    descending = np.argsort(values, axis=1)[:, ::-1]
    top, values = np.take_along_axis(top, descending, axis=1), np.take_along_axis(values, descending, axis=1)
    tied = (values[:, 1:] == values[:, :-1]).any(axis=1)
    if tied.any():
        top[tied] = _orders(scores[tied])[:, : k + 1]
    return top[:, :k]


def _own_positions(scores: np.ndarray, own: np.ndarray) -> np.ndarray:
    """``_positions(_orders(scores))`` at columns ``own [Q, m]``: where a row's own score has no
    equal in that row, its position is the number of higher scores; rows with an own score
    tied take the full argsort (numpy's tie order, as the original)."""
    positions = np.empty(own.shape, dtype=np.int64)
    tied = np.zeros(len(scores), dtype=bool)
    for j in range(own.shape[1]):
        mine = np.take_along_axis(scores, own[:, j : j + 1], axis=1)
        positions[:, j] = np.count_nonzero(scores > mine, axis=1)
        tied |= np.count_nonzero(scores == mine, axis=1) > 1
    if tied.any():
        positions[tied] = np.take_along_axis(_positions(_orders(scores[tied])), own[tied], axis=1)
    return positions


def _positions(order: np.ndarray) -> np.ndarray:
    positions = np.empty_like(order)
    rows = np.arange(order.shape[0])[:, None]
    positions[rows, order] = np.arange(order.shape[1])[None, :]
    return positions


def dcg_at(relevance: np.ndarray, ranking: np.ndarray) -> np.ndarray:
    """DCG of each row's ``ranking`` (indices into that row of ``relevance``)."""
    return _dcg_of_gains(np.take_along_axis(relevance, ranking, axis=1))


def _dcg_of_gains(rel: np.ndarray) -> np.ndarray:
    # gains in the relevance's own dtype (float32 for the original files), as the original
    # ``2 ** rel - 1``; the discounts and the sum in float64
    gains = np.power(rel.dtype.type(2), rel) - rel.dtype.type(1)
    discounts = np.log2(np.arange(rel.shape[1]) + 2.0)
    return (gains / discounts).sum(axis=1)


def ideal_dcg_at(relevance: np.ndarray, k: int) -> np.ndarray:
    """DCG of each row's ideal order (its ``k`` largest relevances, descending). Equal values
    give equal gains, so this is the DCG of the original's argsort order without the sort."""
    n = relevance.shape[1]
    k = min(k, n)
    largest = np.partition(relevance, n - k, axis=1)[:, n - k :]
    return _dcg_of_gains(np.ascontiguousarray(np.sort(largest, axis=1)[:, ::-1]))


def ndcg_at(relevance: np.ndarray, ranking: np.ndarray) -> np.ndarray:
    """NDCG of each row: DCG of the ranking over DCG of the ideal order (0 where that is 0)."""
    ideal = ideal_dcg_at(relevance, ranking.shape[1])
    dcg = dcg_at(relevance, ranking)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(ideal > 0, dcg / np.where(ideal > 0, ideal, 1.0), 0.0)


#: the most queries ranked at once
QUERY_BLOCK = 512
#: queries x gallery items ranked at once: bounds the ranking's temporaries (a partition's int64
#: indices, 16 MB) to a small share of the score matrix at COCO 5K (83 image queries x 25,000
#: captions, where 512 queries took 0.2 GB)
QUERY_ELEMENTS = 2**21


def all_finite(values: np.ndarray) -> bool:
    """True where no value is NaN or infinite, without a boolean copy of ``values`` (a NaN
    makes the minimum and maximum NaN, an infinity makes one of them infinite).

    Example:
        >>> all_finite(np.array([[0.5, 1.0]])), all_finite(np.array([[0.5, np.nan]]))
        (True, False)
    """
    return values.size == 0 or bool(np.isfinite(values.min()) and np.isfinite(values.max()))


def _query_blocks(n_queries: int, n_gallery: int) -> Iterator[slice]:
    rows = max(1, min(QUERY_BLOCK, QUERY_ELEMENTS // n_gallery))
    for start in range(0, n_queries, rows):
        yield slice(start, min(start + rows, n_queries))


def _check_shape(scores: np.ndarray, captions_per_image: int) -> tuple[int, int]:
    n_img, n_cap = scores.shape
    if n_cap != captions_per_image * n_img:
        raise ValueError(
            f"scores are {scores.shape} but {captions_per_image} captions per image need "
            f"{captions_per_image * n_img} columns."
        )
    return n_img, n_cap


def image_to_text(
    scores: np.ndarray,
    captions_per_image: int = 5,
    relevance: dict[str, np.ndarray] | None = None,
    ndcg_k: int = 25,
    keep_top: int = 50,
) -> DirectionResult:
    """Sentence retrieval: one query per image (rows of ``scores [N, cN]``).

    ``relevance[name]`` is ``[cN, N]`` (caption, image), the original layout; the relevance of
    caption q for image n is ``relevance[q, n]``. Queries are ranked in blocks of
    at most ``QUERY_ELEMENTS`` scores, so memory stays bounded for COCO 5K.

    Example:
        >>> image_to_text(np.eye(2).repeat(2, axis=1), captions_per_image=2).ranks
        array([0., 0.])
    """
    n_img, n_cap = _check_shape(scores, captions_per_image)
    c = captions_per_image
    ranks, top = np.empty(n_img), np.empty((n_img, min(keep_top, n_cap)), dtype=np.int64)
    ndcg = {name: np.empty(n_img) for name in relevance or {}}
    for block_rows in _query_blocks(n_img, n_cap):
        rows = np.arange(block_rows.start, block_rows.stop)
        block = np.asarray(scores[block_rows])
        order = _top_orders(block, max(top.shape[1], ndcg_k if relevance else 0))
        own = rows[:, None] * c + np.arange(c)[None]
        ranks[rows] = _own_positions(block, own).min(axis=1)
        top[rows] = order[:, : top.shape[1]]
        for name, rel in (relevance or {}).items():
            ndcg[name][rows] = ndcg_at(np.asarray(rel[:, rows]).T, order[:, :ndcg_k])
    return DirectionResult(ranks, top, ndcg)


def text_to_image(
    scores: np.ndarray,
    captions_per_image: int = 5,
    relevance: dict[str, np.ndarray] | None = None,
    ndcg_k: int = 25,
    keep_top: int = 50,
) -> DirectionResult:
    """Image retrieval: one query per caption (columns of ``scores [N, cN]``).

    Example:
        >>> text_to_image(np.eye(2).repeat(2, axis=1), captions_per_image=2).ranks
        array([0., 0., 0., 0.])
    """
    n_img, n_cap = _check_shape(scores, captions_per_image)
    ranks = np.empty(n_cap)
    top = np.empty((n_cap, min(keep_top, n_img)), dtype=np.int64)
    ndcg = {name: np.empty(n_cap) for name in relevance or {}}
    for block_cols in _query_blocks(n_cap, n_img):
        cols = np.arange(block_cols.start, block_cols.stop)
        block = np.ascontiguousarray(np.asarray(scores[:, block_cols]).T)
        order = _top_orders(block, max(top.shape[1], ndcg_k if relevance else 0))
        ranks[cols] = _own_positions(block, (cols // captions_per_image)[:, None])[:, 0]
        top[cols] = order[:, : top.shape[1]]
        for name, rel in (relevance or {}).items():
            ndcg[name][cols] = ndcg_at(np.asarray(rel[cols]), order[:, :ndcg_k])
    return DirectionResult(ranks, top, ndcg)


def summarize(result: DirectionResult, exclude_zero_ndcg: bool) -> dict[str, float]:
    """R@1/5/10, medr, meanr and mean NDCG per relevance.

    ``exclude_zero_ndcg``: the original averages sentence-retrieval NDCG over non-zero values
    only (``ndcgs != 0``) and image-retrieval NDCG over every query; pass True for i2t to match.
    """
    ranks = result.ranks
    # 100 * count / n, in the original's order of operations (bit-identical figures)
    out = {f"r{k}": 100.0 * int(np.count_nonzero(ranks < k)) / len(ranks) for k in RECALL_AT}
    out["medr"] = float(np.floor(np.median(ranks)) + 1)
    out["meanr"] = float(ranks.mean() + 1)
    for name, values in result.ndcg.items():
        kept = values[values != 0] if exclude_zero_ndcg else values
        out[f"ndcg_{name}"] = float(kept.mean()) if kept.size else 0.0
    return out
