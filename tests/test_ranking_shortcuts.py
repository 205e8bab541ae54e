"""The partial-sort ranking of :mod:`xmatch.eval.metrics` equals the original's full argsort,
ties included (REFERENCE.md B7-B8: rankings are ``argsort(scores)[::-1]``, numpy's tie order)."""

import tracemalloc

import numpy as np
import pytest

from xmatch.eval import metrics


def full_sort_image_to_text(scores, c, relevance, ndcg_k=25, keep_top=50):
    """The original's evaluation, written plainly: a full argsort per query."""
    order = np.argsort(scores, axis=1)[:, ::-1]
    positions = np.argsort(order, axis=1)
    own = np.arange(len(scores))[:, None] * c + np.arange(c)[None]
    ranks = np.take_along_axis(positions, own, axis=1).min(axis=1)
    rel = relevance.T
    ideal = metrics.dcg_at(rel, np.argsort(rel, axis=1)[:, ::-1][:, :ndcg_k])
    dcg = metrics.dcg_at(rel, order[:, :ndcg_k])
    return ranks, order[:, :keep_top], np.where(ideal > 0, dcg / np.where(ideal > 0, ideal, 1.0), 0.0)


def full_sort_text_to_image(scores, c, relevance, ndcg_k=25, keep_top=50):
    queries = np.ascontiguousarray(scores.T)
    order = np.argsort(queries, axis=1)[:, ::-1]
    positions = np.argsort(order, axis=1)
    ranks = positions[np.arange(len(queries)), np.arange(len(queries)) // c]
    ideal = metrics.dcg_at(relevance, np.argsort(relevance, axis=1)[:, ::-1][:, :ndcg_k])
    dcg = metrics.dcg_at(relevance, order[:, :ndcg_k])
    return ranks, order[:, :keep_top], np.where(ideal > 0, dcg / np.where(ideal > 0, ideal, 1.0), 0.0)


@pytest.mark.parametrize("levels", [None, 40, 6], ids=["distinct", "some-ties", "many-ties"])
def test_partial_sorts_rank_as_the_full_argsort(levels):
    n, c = 120, 5
    rng = np.random.default_rng(3)
    scores = rng.random((n, n * c)).astype(np.float32)
    if levels:  # scores on a coarse grid tie often, the own items' too
        scores = np.round(scores * levels) / levels
    scores[np.arange(n), np.arange(n) * c] += 0.3  # some queries right, so the ranks spread
    relevance = np.round(rng.random((n * c, n)), 1).astype(np.float32)  # NDCG's ideal order ties too
    for fast, plain in (
        (metrics.image_to_text(scores, c, {"rel": relevance}), full_sort_image_to_text(scores, c, relevance)),
        (metrics.text_to_image(scores, c, {"rel": relevance}), full_sort_text_to_image(scores, c, relevance)),
    ):
        np.testing.assert_array_equal(fast.ranks, plain[0])
        np.testing.assert_array_equal(fast.top, plain[1])
        np.testing.assert_array_equal(fast.ndcg["rel"], plain[2])


def test_the_shortcut_is_taken_where_there_are_no_ties_and_left_where_there_are(monkeypatch):
    full_sorts = []
    orders = metrics._orders
    monkeypatch.setattr(metrics, "_orders", lambda s: full_sorts.append(len(s)) or orders(s))
    scores = np.random.default_rng(0).random((30, 150)).astype(np.float32)
    metrics.image_to_text(scores, 5)
    assert full_sorts == [], "distinct scores need no full sort"
    scores[4, :] = 0.5  # one query whose scores all tie
    ranks = metrics.image_to_text(scores, 5).ranks
    assert full_sorts == [1, 1], "that query alone is sorted in full, once for its top and once for its rank"
    assert ranks[4] == np.argsort(np.argsort(scores[4])[::-1])[20:25].min()


@pytest.mark.parametrize("k", [1, 49, 50, 149, 150, 400])
def test_top_lists_of_any_length(k):
    scores = np.round(np.random.default_rng(k).random((20, 150)), 2).astype(np.float32)
    np.testing.assert_array_equal(metrics._top_orders(scores, k), np.argsort(scores, axis=1)[:, ::-1][:, :k])


def test_ranking_temporaries_stay_a_small_share_of_the_score_matrix():
    # 512 image queries at a time over a wide gallery took int64 partitions of 0.2 GB at
    # COCO 5K; queries are now ranked in blocks of QUERY_ELEMENTS scores
    scores = np.random.default_rng(0).random((400, 20_000), dtype=np.float32)  # 32 MB, 50 captions an image
    tracemalloc.start()
    try:
        metrics.image_to_text(scores, 50)
        metrics.text_to_image(scores, 50)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 12 * metrics.QUERY_ELEMENTS + 2**20, f"{peak / 2**20:.1f} MiB of temporaries"


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_scores_are_found_without_a_copy_of_the_matrix(bad):
    scores = np.random.default_rng(0).random((400, 20_000), dtype=np.float32)
    assert metrics.all_finite(scores) and metrics.all_finite(np.empty((0, 5)))
    tracemalloc.start()
    try:
        metrics.all_finite(scores)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2**20, "np.isfinite(scores).all() made an 8 MB boolean copy"
    scores[123, 4567] = bad
    assert not metrics.all_finite(scores)
