"""The papers' evaluation protocol: parity with the original TERAN evaluation on the
eval-small fixture, properties of the metrics, and the real COCO 5K test-split structure."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from conftest import FIXTURES, NDCG_RTOL
from xmatch.eval import metrics
from xmatch.eval.metrics import image_to_text, text_to_image
from xmatch.eval.protocol import evaluate_scores

pytestmark = pytest.mark.cpu_kernels  # floats from the CPU's kernels against stored ones (docs/testing.md)

EVAL_SMALL = FIXTURES / "teran-original" / "eval-small"
METRIC_ORDER = ("r1", "r5", "r10", "medr", "meanr", "ndcg_rougel", "ndcg_spice")


@pytest.fixture(scope="module")
def eval_io() -> dict[str, np.ndarray]:
    return dict(np.load(EVAL_SMALL / "io.npz"))


@pytest.fixture(scope="module")
def relevance() -> dict[str, np.ndarray]:
    folder = EVAL_SMALL / "coco" / "relevances"
    return {
        name: np.fromfile(folder / f"coco-test-{method}.npy", np.float32).reshape(1250, 250)
        for name, method in (("rougel", "rougeL"), ("spice", "spice"))
    }


def _row(figures: dict[str, float]) -> list[float]:
    return [figures[k] for k in METRIC_ORDER]


def assert_row_equal(got: list[float], expected) -> None:
    """R@1/5/10, medr, meanr exactly; the two NDCG figures to NDCG_RTOL."""
    np.testing.assert_array_equal(got[:5], expected[:5])
    np.testing.assert_allclose(got[5:], expected[5:], rtol=NDCG_RTOL, atol=0)


def test_coco1k_style_folds_match_the_original(eval_io, relevance):
    result = evaluate_scores(eval_io["sim_MrSw"], "coco-1k", relevance=relevance, fold_images=50)
    for f, fold in enumerate(result.folds):
        expected = eval_io["fold_results"][f]
        assert_row_equal(_row(fold["i2t"]), expected[:7])
        assert_row_equal(_row(fold["t2i"]), expected[7:14])
        assert fold["rsum"] == expected[16]
    mean = eval_io["fold_mean_metrics"]
    assert_row_equal(_row(result.i2t), mean[:7])
    assert_row_equal(_row(result.t2i), mean[7:14])
    assert result.rsum == mean[16]
    assert result.printed_rsum == float(eval_io["fold_printed_rsum"])


def test_coco1k_style_per_query_outputs_match_the_original(eval_io, relevance):
    q = evaluate_scores(eval_io["sim_MrSw"], "coco-1k", relevance=relevance, fold_images=50).queries
    np.testing.assert_array_equal(np.array(q["i2t_ranks"]).reshape(5, 50), eval_io["fold_i2t_ranks"])
    np.testing.assert_array_equal(np.array(q["t2i_ranks"]).reshape(5, 250), eval_io["fold_t2i_ranks"])
    # stored indices are global (into the whole matrix); the original's are within the fold
    i2t_top1 = np.array(q["i2t_top"])[:, 0].reshape(5, 50) - 250 * np.arange(5)[:, None]
    t2i_top = np.array(q["t2i_top"]).reshape(5, 250, 50) - 50 * np.arange(5)[:, None, None]
    np.testing.assert_array_equal(i2t_top1, eval_io["fold_i2t_top1"])
    np.testing.assert_array_equal(t2i_top, eval_io["fold_t2i_top50"])
    for k, name in enumerate(("rougel", "spice")):
        np.testing.assert_allclose(np.array(q[f"i2t_ndcg_{name}"]).reshape(5, 50), eval_io["fold_i2t_ndcg"][..., k], rtol=NDCG_RTOL, atol=0)
        np.testing.assert_allclose(np.array(q[f"t2i_ndcg_{name}"]).reshape(5, 250), eval_io["fold_t2i_ndcg"][..., k], rtol=NDCG_RTOL, atol=0)


def test_5k_style_full_run_matches_the_original(eval_io, relevance):
    result = evaluate_scores(eval_io["sim_MrSw"], "coco-5k", relevance=relevance)
    assert_row_equal(_row(result.i2t), eval_io["full_i2t_metrics"])
    assert_row_equal(_row(result.t2i), eval_io["full_t2i_metrics"])
    assert result.rsum == float(eval_io["full_rsum"])
    assert result.printed_rsum == result.rsum and result.folds == []
    q = result.queries
    np.testing.assert_array_equal(q["i2t_ranks"], eval_io["full_i2t_ranks"])
    np.testing.assert_array_equal(np.array(q["i2t_top"])[:, 0], eval_io["full_i2t_top1"])
    np.testing.assert_array_equal(q["t2i_ranks"], eval_io["full_t2i_ranks"])
    np.testing.assert_array_equal(q["t2i_top"], eval_io["full_t2i_top50"])
    np.testing.assert_allclose(np.c_[q["i2t_ndcg_rougel"], q["i2t_ndcg_spice"]], eval_io["full_i2t_ndcg"], rtol=NDCG_RTOL, atol=0)
    np.testing.assert_allclose(np.c_[q["t2i_ndcg_rougel"], q["t2i_ndcg_spice"]], eval_io["full_t2i_ndcg"], rtol=NDCG_RTOL, atol=0)


def test_query_blocks_do_not_change_the_results(eval_io, relevance, monkeypatch):
    reference = evaluate_scores(eval_io["sim_MwSr"], "full", relevance=relevance)
    monkeypatch.setattr(metrics, "QUERY_BLOCK", 7)
    blocked = evaluate_scores(eval_io["sim_MwSr"], "full", relevance=relevance)
    assert blocked.figures() == reference.figures()
    assert blocked.queries.keys() == reference.queries.keys()
    for key, values in reference.queries.items():
        np.testing.assert_array_equal(blocked.queries[key], values)


def test_perfect_similarity_gives_r1_100_and_ndcg_1():
    n, c = 40, 5
    rng = np.random.default_rng(0)
    relevance = rng.random((n * c, n)).astype(np.float32)
    relevance[np.arange(n * c), np.arange(n * c) // c] = 1.0  # a caption is most relevant to its image
    scores = relevance.T.copy()  # ranking by score = ranking by relevance, both directions
    result = evaluate_scores(scores, "full", relevance={"rel": relevance})
    for direction in (result.i2t, result.t2i):
        assert direction["r1"] == 100.0 and direction["medr"] == 1.0 and direction["meanr"] == 1.0
    assert result.t2i["ndcg_rel"] == pytest.approx(1.0, abs=1e-12)
    assert result.i2t["ndcg_rel"] == pytest.approx(1.0, abs=1e-12)
    assert result.rsum == 600.0


def test_random_similarity_is_at_chance_level():
    n, c = 200, 5
    scores = np.random.default_rng(1).random((n, n * c)).astype(np.float32)
    result = evaluate_scores(scores, "full")
    # t2i: the one true image among n lands in the top K with probability K / n
    for k in (1, 5, 10):
        assert result.t2i[f"r{k}"] == pytest.approx(100 * k / n, abs=1.5 + 0.2 * k)
    # i2t: at least one of c true captions among n c in the top K: 1 - C(nc - c, K) / C(nc, K)
    for k in (1, 5, 10):
        chance = 100 * (1 - np.prod([(n * c - c - i) / (n * c - i) for i in range(k)]))
        assert result.i2t[f"r{k}"] == pytest.approx(chance, abs=3.0)
    assert result.t2i["meanr"] == pytest.approx((n + 1) / 2, rel=0.05)


def test_ties_are_ranked_like_numpy_argsort_reversed():
    scores = np.zeros((3, 15), dtype=np.float32)  # every caption ties
    order = np.argsort(scores, axis=1)[:, ::-1]
    r = image_to_text(scores, 5)
    expected = [min(int(np.where(order[n] == 5 * n + j)[0][0]) for j in range(5)) for n in range(3)]
    np.testing.assert_array_equal(r.ranks, expected)
    assert text_to_image(scores, 5).top.shape == (15, 3)


def test_bad_inputs_get_clear_errors():
    with pytest.raises(ValueError, match="captions per image"):
        evaluate_scores(np.zeros((4, 19)))
    with pytest.raises(ValueError, match="NaN"):
        evaluate_scores(np.full((2, 10), np.nan))
    with pytest.raises(ValueError, match="folds of 1000"):
        evaluate_scores(np.zeros((1500, 7500)), "coco-1k")
    with pytest.raises(ValueError, match="unknown protocol"):
        evaluate_scores(np.zeros((2, 10)), "coco-2k")
    with pytest.raises(ValueError, match="relevance 'r'"):
        evaluate_scores(np.zeros((2, 10)), relevance={"r": np.zeros((2, 10))})


def test_json_output_holds_every_figure(tmp_path: Path, eval_io, relevance):
    result = evaluate_scores(eval_io["sim_MrSw"], "coco-1k", relevance=relevance, fold_images=50)
    result.save_json(tmp_path / "r.json")
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["i2t"]["r1"] == result.i2t["r1"] and len(data["folds"]) == 5 and "queries" not in data
    result.save_json(tmp_path / "q.json", with_queries=True)
    assert len(json.loads((tmp_path / "q.json").read_text())["queries"]["t2i_ranks"]) == 1250
    assert "rsum" in result.table() and "ndcg_spice" in result.table()


# --- the real structure of the COCO 5K test split (ids shipped by the eccv-caption package) ---


@pytest.fixture(scope="module")
def coco5k():
    eccv_caption = pytest.importorskip("eccv_caption")
    m = eccv_caption.Metrics()
    caption_ids = np.asarray(m.coco_ids, dtype=np.int64)
    image_ids = np.array([m.coco_gts["t2i"][int(cid)][0] for cid in caption_ids], dtype=np.int64)
    return m, caption_ids, image_ids[::5]


def test_karpathy_5k_test_split_has_five_consecutive_captions_per_image(coco5k):
    m, caption_ids, images = coco5k
    assert caption_ids.shape == (25000,) and len(set(caption_ids.tolist())) == 25000
    assert images.shape == (5000,) and len(set(images.tolist())) == 5000
    owner = np.array([m.coco_gts["t2i"][int(cid)][0] for cid in caption_ids])
    # caption k belongs to image k // 5: the bookkeeping every protocol here relies on
    np.testing.assert_array_equal(owner, np.repeat(images, 5))
    for n in (0, 1234, 4999):
        assert sorted(m.coco_gts["i2t"][int(images[n])]) == sorted(caption_ids[5 * n : 5 * n + 5].tolist())


def _synthetic_5k(seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    scores = rng.standard_normal((5000, 25000), dtype=np.float32)
    scores[np.arange(25000) // 5, np.arange(25000)] += 2.5  # recalls well inside (0, 100)
    return scores


def _retrieved(result, caption_ids, images, k: int = 10) -> dict[str, dict[int, list[int]]]:
    q = result.queries
    return {
        "i2t": {int(images[n]): caption_ids[q["i2t_top"][n, :k]].tolist() for n in range(5000)},
        "t2i": {int(caption_ids[j]): images[q["t2i_top"][j, :k]].tolist() for j in range(25000)},
    }


def test_coco1k_folds_at_full_size_agree_with_eccv_caption(coco5k):
    m, caption_ids, images = coco5k
    scores = _synthetic_5k(0)
    result = evaluate_scores(scores, "coco-1k")
    assert len(result.folds) == 5
    retrieved = _retrieved(result, caption_ids, images)
    for k in (1, 5, 10):
        theirs = m.coco_1k_recalls(retrieved, "all", K=k)
        assert result.i2t[f"r{k}"] == pytest.approx(100 * theirs["i2t"], abs=1e-9)
        assert result.t2i[f"r{k}"] == pytest.approx(100 * theirs["t2i"], abs=1e-9)
    assert 20 < result.t2i["r1"] < 90


@pytest.mark.slow
def test_coco5k_at_full_size_agrees_with_eccv_caption(coco5k):
    m, caption_ids, images = coco5k
    result = evaluate_scores(_synthetic_5k(1), "coco-5k")
    retrieved = _retrieved(result, caption_ids, images)
    for k in (1, 5, 10):
        theirs = m.coco_5k_recalls(retrieved, "all", K=k)
        assert result.i2t[f"r{k}"] == pytest.approx(100 * theirs["i2t"], abs=1e-9)
        assert result.t2i[f"r{k}"] == pytest.approx(100 * theirs["t2i"], abs=1e-9)


def test_ndcg_from_relevance_computed_here_matches_the_original(eval_io):
    from xmatch.eval.relevance import relevance_matrix

    rougel = relevance_matrix(list(eval_io["captions"]), "rougel", progress=False)
    result = evaluate_scores(eval_io["sim_MrSw"], "coco-1k", relevance={"rougel": rougel}, fold_images=50)
    assert result.i2t["ndcg_rougel"] == pytest.approx(eval_io["fold_mean_metrics"][5], rel=NDCG_RTOL)
    assert result.t2i["ndcg_rougel"] == pytest.approx(eval_io["fold_mean_metrics"][12], rel=NDCG_RTOL)
