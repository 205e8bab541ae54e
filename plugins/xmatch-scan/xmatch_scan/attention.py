"""Stacked Cross Attention scores, vectorised over every image and every caption.

Lee, Chen, Hua, Hu, He. "Stacked Cross Attention for Image-Text Matching", ECCV 2018, and
its code (kuanghuei/SCAN, ``model.py``: ``func_attention``, ``xattn_score_t2i``,
``xattn_score_i2t``). For regions ``v_i`` and words ``e_j``:

1. raw scores ``s_ij = v_i . e_j`` (the cosine, both sides being unit vectors), every region
   with every word of a block at once (:func:`xmatch.plugin.pairwise_cosines`);
2. normalised over the *query* axis for each context element (``raw_feature_norm``; the
   default ``clipped_l2norm`` is a LeakyReLU of slope 0.1 followed by an L2 norm whose eps
   1e-8 is added to the norm, as in the code, where the paper writes ``[.]_+``);
3. attention ``alpha = softmax(lambda_softmax * s_bar)`` over the *context* axis;
4. attended vector ``a_q = sum_c alpha_qc x_c`` and relevance ``R_q = cos(x_q, a_q)`` (eps
   1e-8 on the product of the norms);
5. pooled over the query axis: LogSumExp ``(1/lambda_lse) log sum exp(lambda_lse R)``, mean
   (the paper's AVG), max or sum.

Text-to-image (``t2i``) queries with words over the regions; image-to-text (``i2t``) queries
with regions over the words. The original loops over captions and builds the attended vectors
``[n_images, words, d]`` one caption at a time; here every (image, caption) pair of a block is
scored at once, and the attended vectors are never materialised:
``e . a = sum_c alpha_c s_c`` and ``|a|^2 = alpha^T G alpha`` with the Gram matrix ``G`` of the
context set, which is mathematically the same cosine at a fraction of the memory.

Padded regions and words (mask False) take part in nothing: they get no attention, add nothing
to a normalisation and are left out of the pooling.
"""

from __future__ import annotations

import typing
from typing import Literal

import torch
import torch.nn.functional as F
from xmatch.plugin import pairwise_cosines

Direction = Literal["t2i", "i2t"]
RawFeatureNorm = Literal["clipped_l2norm", "l2norm", "clipped_l1norm", "l1norm", "softmax", "clipped", "no_norm"]
AggFunc = Literal["LogSumExp", "Mean", "Max", "Sum"]

DIRECTIONS: tuple[str, ...] = typing.get_args(Direction)
RAW_FEATURE_NORMS: tuple[str, ...] = typing.get_args(RawFeatureNorm)
AGG_FUNCS: tuple[str, ...] = typing.get_args(AggFunc)

#: eps of the original ``l2norm``, ``l1norm`` and ``cosine_similarity`` helpers.
EPS = 1e-8
#: slope of the original's clipping (``nn.LeakyReLU(0.1)``).
LEAKY_SLOPE = 0.1


def check_choice(value: str, choices: tuple[str, ...], what: str) -> None:
    """Raise a ValueError naming the accepted values when ``value`` is not one of them."""
    if value not in choices:
        raise ValueError(f"{what} must be one of {', '.join(repr(c) for c in choices)}; got {value!r}.")


def normalize_raw_scores(scores: torch.Tensor, query_mask: torch.Tensor, dim: int, how: RawFeatureNorm) -> torch.Tensor:
    """Normalise raw region-word scores over the query axis ``dim`` (step 2 of the module doc).

    Padded query positions must hold 0 in ``scores`` (zero-filled tokens give that); they then
    add nothing to the L2 / L1 sums, and the softmax excludes them through ``query_mask``.

    Args:
        scores: raw dot products, any layout.
        query_mask: bool, broadcastable to ``scores``, True for real query elements.
        dim: the query axis.
        how: one of :data:`RAW_FEATURE_NORMS`. ``l1norm`` and ``clipped_l1norm`` divide by
            ``sum |s| + 1e-8``: the original calls an undefined ``l1norm_d`` there (a
            NameError); its ``l1norm`` helper is what it evidently meant.

    Example:
        >>> s = torch.tensor([[3.0, -4.0]])
        >>> normalize_raw_scores(s, torch.tensor([[True, True]]), 1, "clipped_l2norm")
        tensor([[ 0.9912, -0.1322]])
    """
    check_choice(how, RAW_FEATURE_NORMS, "raw_feature_norm")
    if how == "softmax":
        return torch.softmax(scores.masked_fill(~query_mask, float("-inf")), dim=dim)
    if how.startswith("clipped"):
        scores = F.leaky_relu(scores, LEAKY_SLOPE)
    if how.endswith("l2norm"):
        # vector_norm has a zero gradient at a zero vector (a padded row), sqrt(sum) a NaN one.
        return scores / (torch.linalg.vector_norm(scores, dim=dim, keepdim=True) + EPS)
    if how.endswith("l1norm"):
        return scores / (scores.abs().sum(dim, keepdim=True) + EPS)
    return scores


def aggregate(relevance: torch.Tensor, mask: torch.Tensor, agg_func: AggFunc, lambda_lse: float) -> torch.Tensor:
    """Pool relevances ``[..., Q]`` over their real query elements (last axis).

    ``LogSumExp`` is ``(1/lambda_lse) log sum exp(lambda_lse R)``; it is computed with the
    usual max subtraction (the original has none), which is the same value, safe for any
    ``lambda_lse``.

    Example:
        >>> aggregate(torch.tensor([[0.5, 0.1, 9.0]]), torch.tensor([[True, True, False]]), "Mean", 6.0)
        tensor([0.3000])
    """
    check_choice(agg_func, AGG_FUNCS, "agg_func")
    if agg_func == "LogSumExp":
        return torch.logsumexp(lambda_lse * relevance.masked_fill(~mask, float("-inf")), dim=-1) / lambda_lse
    if agg_func == "Max":
        return relevance.masked_fill(~mask, float("-inf")).amax(dim=-1)
    total = relevance.masked_fill(~mask, 0.0).sum(dim=-1)
    if agg_func == "Sum":
        return total
    return total / mask.sum(dim=-1).to(total.dtype)


def zero_padding(tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Tokens with every padded slot set to 0, so padding adds nothing to any sum."""
    return tokens.masked_fill(~mask.unsqueeze(-1), 0.0)


def _cosine(dot: torch.Tensor, sq_norm_a: torch.Tensor, sq_norm_b: torch.Tensor) -> torch.Tensor:
    # (x1 . x2) / max(|x1| |x2|, eps), as the original cosine_similarity; clamping the squared
    # product keeps the gradient finite where a norm is 0.
    return dot / (sq_norm_a * sq_norm_b).clamp_min(EPS**2).sqrt()


def xattn_relevance(
    regions: torch.Tensor,
    region_mask: torch.Tensor,
    words: torch.Tensor,
    word_mask: torch.Tensor,
    direction: Direction,
    lambda_softmax: float,
    raw_feature_norm: RawFeatureNorm = "clipped_l2norm",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Relevance of every query element of every (image, caption) pair.

    Args:
        regions: ``[I, R, d]`` region embeddings (padded slots may hold anything finite).
        region_mask: ``[I, R]`` True for real regions.
        words: ``[T, W, d]`` word embeddings.
        word_mask: ``[T, W]`` True for real words.
        direction: ``"t2i"`` (query = words, context = regions) or ``"i2t"`` (query =
            regions, context = words).
        lambda_softmax: inverse temperature of the attention softmax (lambda_1).
        raw_feature_norm: normalisation of the raw scores over the query axis.

    Returns:
        ``(relevance [I, T, Q], query_mask)`` with ``Q`` = words (t2i) or regions (i2t) and
        ``query_mask`` broadcastable to the relevance, True for real query elements.

    Example:
        >>> v = F.normalize(torch.randn(2, 3, 4), dim=-1); e = F.normalize(torch.randn(5, 6, 4), dim=-1)
        >>> rel, mask = xattn_relevance(v, torch.ones(2, 3, dtype=torch.bool), e, torch.ones(5, 6, dtype=torch.bool), "t2i", 9.0)
        >>> rel.shape, mask.shape
        (torch.Size([2, 5, 6]), torch.Size([1, 5, 6]))
    """
    check_choice(direction, DIRECTIONS, "direction")
    regions, words = zero_padding(regions, region_mask), zero_padding(words, word_mask)
    n_img, n_reg, _ = regions.shape
    n_txt, n_word, _ = words.shape
    s = pairwise_cosines(regions, words)  # [I, R, T, W], 0 at padded slots
    region_axis = region_mask[:, :, None, None]
    word_axis = word_mask[None, None]
    if direction == "t2i":
        # For each region: normalise over the words; for each word: softmax over the regions.
        s_bar = normalize_raw_scores(s, word_axis, dim=3, how=raw_feature_norm)
        alpha = torch.softmax((lambda_softmax * s_bar).masked_fill(~region_axis, float("-inf")), dim=1)
        dot = (alpha * s).sum(dim=1)  # e_w . a_w  [I, T, W]
        gram = regions @ regions.transpose(1, 2)  # [I, R, R]
        g_alpha = (gram @ alpha.reshape(n_img, n_reg, n_txt * n_word)).view_as(alpha)
        sq_attended = (alpha * g_alpha).sum(dim=1)  # |a_w|^2
        sq_query = words.square().sum(dim=-1)[None]  # [1, T, W]
        return _cosine(dot, sq_query, sq_attended), word_mask[None]
    # For each word: normalise over the regions; for each region: softmax over the words.
    s_bar = normalize_raw_scores(s, region_axis, dim=1, how=raw_feature_norm)
    alpha = torch.softmax((lambda_softmax * s_bar).masked_fill(~word_axis, float("-inf")), dim=3)
    dot = (alpha * s).sum(dim=3)  # v_r . a_r  [I, R, T]
    gram = words @ words.transpose(1, 2)  # [T, W, W]
    per_text = alpha.permute(2, 0, 1, 3).reshape(n_txt, n_img * n_reg, n_word)
    sq_attended = (per_text * (per_text @ gram)).sum(dim=-1).view(n_txt, n_img, n_reg).permute(1, 2, 0)
    sq_query = regions.square().sum(dim=-1)[:, :, None]  # [I, R, 1]
    relevance = _cosine(dot, sq_query, sq_attended).transpose(1, 2)  # [I, T, R]
    return relevance, region_mask[:, None]


def xattn_scores(
    regions: torch.Tensor,
    region_mask: torch.Tensor,
    words: torch.Tensor,
    word_mask: torch.Tensor,
    direction: Direction,
    lambda_softmax: float,
    agg_func: AggFunc = "LogSumExp",
    lambda_lse: float = 6.0,
    raw_feature_norm: RawFeatureNorm = "clipped_l2norm",
) -> torch.Tensor:
    """SCAN similarity ``[I, T]`` of every image with every caption (see the module doc).

    Example:
        >>> v = F.normalize(torch.randn(2, 3, 4), dim=-1); e = F.normalize(torch.randn(5, 6, 4), dim=-1)
        >>> xattn_scores(v, torch.ones(2, 3, dtype=torch.bool), e, torch.ones(5, 6, dtype=torch.bool), "i2t", 4.0, "Mean").shape
        torch.Size([2, 5])
    """
    relevance, mask = xattn_relevance(regions, region_mask, words, word_mask, direction, lambda_softmax, raw_feature_norm)
    return aggregate(relevance, mask.expand_as(relevance), agg_func, lambda_lse)


def sum_max_scores(
    regions: torch.Tensor,
    region_mask: torch.Tensor,
    words: torch.Tensor,
    word_mask: torch.Tensor,
    direction: Direction,
) -> torch.Tensor:
    """The Sum-Max baselines ``[I, T]`` the SCAN paper compares with (after Karpathy and
    Fei-Fei): ``t2i`` = sum over words of the best region score, ``i2t`` = sum over regions of
    the best word score.

    Example:
        >>> v = torch.eye(2)[None]; m = torch.ones(1, 2, dtype=torch.bool)
        >>> sum_max_scores(v, m, v, m, "t2i")
        tensor([[2.]])
    """
    check_choice(direction, DIRECTIONS, "direction")
    s = pairwise_cosines(zero_padding(regions, region_mask), zero_padding(words, word_mask))
    if direction == "t2i":
        best = s.masked_fill(~region_mask[:, :, None, None], float("-inf")).amax(dim=1)  # [I, T, W]
        return best.masked_fill(~word_mask[None], 0.0).sum(dim=-1)
    best = s.masked_fill(~word_mask[None, None], float("-inf")).amax(dim=3)  # [I, R, T]
    return best.masked_fill(~region_mask[:, :, None], 0.0).sum(dim=1)
