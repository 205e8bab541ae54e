"""The SCAN equations: hand-computed values and the original code's per-caption loop."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from _scan_reference import func_attention, ragged_xattn_score, xattn_score
from xmatch import Embeddings
from xmatch.components.poolers import MrSwPooler, MwSrPooler

from xmatch_scan import aggregate, normalize_raw_scores, sum_max_scores, xattn_relevance, xattn_scores
from xmatch_scan.attention import AGG_FUNCS, RAW_FEATURE_NORMS

F64 = torch.float64


def unit(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return F.normalize(torch.randn(*shape, generator=g, dtype=F64), dim=-1)


def lengths_mask(lengths, width):
    return torch.arange(width)[None] < torch.as_tensor(lengths)[:, None]


# --- hand-computed ------------------------------------------------------------------------


def test_clipped_l2norm_is_leaky_relu_then_l2_with_eps_on_the_norm():
    s = torch.tensor([[3.0, -4.0]], dtype=F64)
    out = normalize_raw_scores(s, torch.ones(1, 2, dtype=torch.bool), 1, "clipped_l2norm")
    norm = math.sqrt(9 + 0.4**2) + 1e-8  # LeakyReLU(0.1): -4 -> -0.4
    torch.testing.assert_close(out, torch.tensor([[3 / norm, -0.4 / norm]], dtype=F64), rtol=0, atol=1e-15)
    # the other options on the same row
    ones = torch.ones(1, 2, dtype=torch.bool)
    torch.testing.assert_close(normalize_raw_scores(s, ones, 1, "l2norm"), s / (5 + 1e-8))
    torch.testing.assert_close(normalize_raw_scores(s, ones, 1, "l1norm"), s / (7 + 1e-8))
    torch.testing.assert_close(normalize_raw_scores(s, ones, 1, "clipped_l1norm"), torch.tensor([[3.0, -0.4]], dtype=F64) / (3.4 + 1e-8))
    torch.testing.assert_close(normalize_raw_scores(s, ones, 1, "clipped"), torch.tensor([[3.0, -0.4]], dtype=F64))
    torch.testing.assert_close(normalize_raw_scores(s, ones, 1, "softmax"), torch.softmax(s, 1))
    torch.testing.assert_close(normalize_raw_scores(s, ones, 1, "no_norm"), s)


def test_two_orthogonal_regions_and_one_word_by_hand():
    """v1 = (1, 0), v2 = (0, 1), e = (0.6, 0.8)."""
    v = torch.tensor([[[1.0, 0.0], [0.0, 1.0]]], dtype=F64)
    e = torch.tensor([[[0.6, 0.8]]], dtype=F64)
    mv, me = torch.ones(1, 2, dtype=torch.bool), torch.ones(1, 1, dtype=torch.bool)
    # t2i: over one word each region's clipped-l2 score is ~1, so the word attends both
    # regions equally: a = (0.5, 0.5), R = cos(e, a) = 0.7 / sqrt(0.5).
    eps_shift = torch.tensor([0.6 / (0.6 + 1e-8), 0.8 / (0.8 + 1e-8)], dtype=F64)
    alpha = torch.softmax(9 * eps_shift, 0)
    a = alpha[0] * v[0, 0] + alpha[1] * v[0, 1]
    expected = float((e[0, 0] @ a) / a.norm())
    assert abs(expected - 0.7 / math.sqrt(0.5)) < 1e-7
    got = xattn_scores(v, mv, e, me, "t2i", 9.0, "Mean")
    assert got.item() == pytest.approx(expected, abs=1e-12)
    # i2t: one word to attend to, so a_r = e and R_r = cos(v_r, e) = (0.6, 0.8).
    assert xattn_scores(v, mv, e, me, "i2t", 4.0, "Mean").item() == pytest.approx(0.7, abs=1e-12)
    assert xattn_scores(v, mv, e, me, "i2t", 4.0, "Max").item() == pytest.approx(0.8, abs=1e-12)
    assert xattn_scores(v, mv, e, me, "i2t", 4.0, "Sum").item() == pytest.approx(1.4, abs=1e-12)
    lse = math.log(math.exp(6 * 0.6) + math.exp(6 * 0.8)) / 6
    assert xattn_scores(v, mv, e, me, "i2t", 4.0, "LogSumExp", 6.0).item() == pytest.approx(lse, abs=1e-12)


def test_aggregations_by_hand():
    rel = torch.tensor([[0.2, -0.5, 0.9, 7.0]], dtype=F64)
    mask = torch.tensor([[True, True, True, False]])
    assert aggregate(rel, mask, "Mean", 1.0).item() == pytest.approx(0.2)
    assert aggregate(rel, mask, "Sum", 1.0).item() == pytest.approx(0.6)
    assert aggregate(rel, mask, "Max", 1.0).item() == pytest.approx(0.9)
    lse = math.log(sum(math.exp(20 * r) for r in (0.2, -0.5, 0.9))) / 20
    assert aggregate(rel, mask, "LogSumExp", 20.0).item() == pytest.approx(lse, abs=1e-12)


# --- against the original code --------------------------------------------------------------


@pytest.mark.parametrize("direction", ["t2i", "i2t"])
@pytest.mark.parametrize("agg_func", AGG_FUNCS)
@pytest.mark.parametrize("raw_feature_norm", RAW_FEATURE_NORMS)
def test_scores_match_the_original_loop(direction, agg_func, raw_feature_norm):
    """All regions real (36 in the original, 5 here); captions of different lengths."""
    images = unit(3, 5, 8, seed=1)
    cap_lens = torch.tensor([4, 1, 6, 3])
    captions = unit(4, 6, 8, seed=2).masked_fill(~lengths_mask(cap_lens, 6)[..., None], 0)
    lambda_softmax, lambda_lse = (9.0, 6.0) if direction == "t2i" else (4.0, 20.0)
    expected = xattn_score(images, captions, cap_lens, direction, lambda_softmax, agg_func, lambda_lse, raw_feature_norm)
    got = xattn_scores(images, torch.ones(3, 5, dtype=torch.bool), captions, lengths_mask(cap_lens, 6),
                       direction, lambda_softmax, agg_func, lambda_lse, raw_feature_norm)
    assert got.shape == (3, 4)
    torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("direction", ["t2i", "i2t"])
def test_scores_match_the_original_loop_without_normalised_features(direction):
    """The original takes dot products for the attention and cosines for the relevance; with
    --no_imgnorm the regions are not unit vectors and the two differ."""
    g = torch.Generator().manual_seed(3)
    images = 3 * torch.randn(2, 4, 6, generator=g, dtype=F64)
    cap_lens = torch.tensor([5, 2, 3])
    captions = unit(3, 5, 6, seed=4).masked_fill(~lengths_mask(cap_lens, 5)[..., None], 0)
    expected = xattn_score(images, captions, cap_lens, direction, 9.0, "LogSumExp", 6.0, "clipped_l2norm")
    got = xattn_scores(images, torch.ones(2, 4, dtype=torch.bool), captions, lengths_mask(cap_lens, 5), direction, 9.0)
    torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("direction", ["t2i", "i2t"])
@pytest.mark.parametrize("raw_feature_norm", ["clipped_l2norm", "softmax", "l1norm"])
def test_padded_regions_score_like_images_with_fewer_regions(direction, raw_feature_norm):
    region_lens = torch.tensor([5, 2, 1, 4])
    images = unit(4, 5, 8, seed=5)
    cap_lens = torch.tensor([3, 6, 1])
    captions = unit(3, 6, 8, seed=6)
    expected = ragged_xattn_score(images, region_lens, captions, cap_lens, direction, 9.0, "LogSumExp", 6.0, raw_feature_norm)
    got = xattn_scores(images, lengths_mask(region_lens, 5), captions, lengths_mask(cap_lens, 6),
                       direction, 9.0, "LogSumExp", 6.0, raw_feature_norm)
    torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-10)


def test_t2i_relevance_is_the_cosine_with_the_attended_vector():
    """The attended vectors are never materialised; check the Gram-matrix form against them."""
    images, captions = unit(2, 5, 8, seed=7), unit(3, 4, 8, seed=8)
    rel, mask = xattn_relevance(images, torch.ones(2, 5, dtype=torch.bool), captions, torch.ones(3, 4, dtype=torch.bool), "t2i", 9.0)
    for i in range(2):
        for t in range(3):
            attended, _ = func_attention(captions[t : t + 1], images[i : i + 1], "clipped_l2norm", 9.0)
            torch.testing.assert_close(rel[i, t], F.cosine_similarity(captions[t], attended[0], dim=-1), rtol=1e-12, atol=1e-12)
    assert mask.shape == (1, 3, 4)


def test_one_image_and_one_word_do_not_crash():
    """The original's cosine_similarity(...).squeeze() drops the image axis for one image."""
    images, captions = unit(1, 5, 8, seed=9), unit(4, 1, 8, seed=10)
    for direction in ("t2i", "i2t"):
        scores = xattn_scores(images, torch.ones(1, 5, dtype=torch.bool), captions, torch.ones(4, 1, dtype=torch.bool), direction, 9.0)
        assert scores.shape == (1, 4) and torch.isfinite(scores).all()


def test_sum_max_is_terans_mrsw_and_mwsr():
    region_lens, cap_lens = torch.tensor([5, 3, 1]), torch.tensor([2, 6, 4, 1])
    img = Embeddings(unit(3, 5, 8, seed=11), lengths_mask(region_lens, 5))
    txt = Embeddings(unit(4, 6, 8, seed=12), lengths_mask(cap_lens, 6))
    t2i = sum_max_scores(img.tokens, img.mask, txt.tokens, txt.mask, "t2i")
    i2t = sum_max_scores(img.tokens, img.mask, txt.tokens, txt.mask, "i2t")
    torch.testing.assert_close(t2i, MrSwPooler()(img, txt))
    torch.testing.assert_close(i2t, MwSrPooler()(img, txt))
    # by hand for one pair
    a = img.tokens[1, :3] @ txt.tokens[2, :4].T
    assert t2i[1, 2].item() == pytest.approx(a.amax(0).sum().item())
    assert i2t[1, 2].item() == pytest.approx(a.amax(1).sum().item())


def test_unknown_options_are_named():
    v, m = unit(1, 2, 4), torch.ones(1, 2, dtype=torch.bool)
    with pytest.raises(ValueError, match="agg_func must be one of 'LogSumExp', 'Mean', 'Max', 'Sum'; got 'AVG'"):
        xattn_scores(v, m, v, m, "t2i", 9.0, "AVG")
    with pytest.raises(ValueError, match="raw_feature_norm must be one of .*'clipped_l2norm'"):
        xattn_scores(v, m, v, m, "t2i", 9.0, raw_feature_norm="l1norm_d")
    with pytest.raises(ValueError, match="direction must be one of 't2i', 'i2t'"):
        xattn_scores(v, m, v, m, "t-i", 9.0)
