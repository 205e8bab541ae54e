"""SCAN poolers: Text-Image and Image-Text Stacked Cross Attention, and the Sum-Max baselines.

Lee, Chen, Hua, Hu, He. "Stacked Cross Attention for Image-Text Matching", ECCV 2018. The
equations are in :mod:`xmatch_scan.attention`; these classes make them xmatch poolers, scored
block by block (:meth:`xmatch.Pooler.forward`) so any number of images and captions fits in
bounded memory, with the same scores for every block size.

The paper's "t-i + i-t" ensemble averages the scores of two separately trained models:
``xmatch.eval.evaluate([model_t2i, model_i2t], dataset, protocol)``.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from xmatch.plugin import Embeddings, Pooler

from xmatch_scan.attention import (
    AGG_FUNCS,
    RAW_FEATURE_NORMS,
    AggFunc,
    Direction,
    RawFeatureNorm,
    check_choice,
    sum_max_scores,
    xattn_scores,
)


def check_nonempty(img: Embeddings, txt: Embeddings) -> None:
    """Every image needs a real region and every caption a real word (an empty set has no
    attention to give); raise a ValueError naming the offending items otherwise."""
    for what, e in (("images", img), ("captions", txt)):
        empty = (~e.mask.any(dim=1)).nonzero().flatten()
        if e.mask.shape[1] == 0 or len(empty):
            items = empty[:10].tolist() if e.mask.shape[1] else "all"
            raise ValueError(
                f"SCAN scores need at least one real element per item: {what} {items} have none "
                "(their mask is all False); drop them or fix the mask."
            )


class _ScanPooler(Pooler):
    """Shared block machinery: validation once over the whole inputs, smaller blocks than the
    default because the attention keeps several ``[images, regions, texts, words]`` tensors."""

    direction: ClassVar[Direction]
    block_elements = 1 << 22

    def context(self, img: Embeddings, txt: Embeddings, batch_layout: bool) -> dict[str, Any]:
        check_nonempty(img, txt)
        return {}


class StackedCrossAttentionPooler(_ScanPooler):
    """Stacked Cross Attention score (base of :class:`ScanT2I` and :class:`ScanI2T`).

    Args:
        lambda_softmax: inverse temperature lambda_1 of the attention softmax (the original's
            ``--lambda_softmax``, default 9).
        agg_func: pooling of the relevances: ``"LogSumExp"`` (default), ``"Mean"`` (the paper's
            AVG), ``"Max"`` or ``"Sum"`` (``--agg_func``).
        lambda_lse: lambda_2 of LogSumExp (``--lambda_lse``, default 6); unused otherwise.
        raw_feature_norm: normalisation of the raw scores over the query axis
            (``--raw_feature_norm``): ``"clipped_l2norm"`` (default), ``"l2norm"``,
            ``"clipped_l1norm"``, ``"l1norm"``, ``"softmax"``, ``"clipped"``, ``"no_norm"``.
    """

    def __init__(
        self,
        lambda_softmax: float = 9.0,
        agg_func: AggFunc = "LogSumExp",
        lambda_lse: float = 6.0,
        raw_feature_norm: RawFeatureNorm = "clipped_l2norm",
    ) -> None:
        super().__init__()
        if not hasattr(type(self), "direction"):
            raise TypeError("StackedCrossAttentionPooler is a base class; use ScanT2IPooler ('scan-t2i') or ScanI2TPooler ('scan-i2t').")
        check_choice(agg_func, AGG_FUNCS, "agg_func")
        check_choice(raw_feature_norm, RAW_FEATURE_NORMS, "raw_feature_norm")
        for name, value in (("lambda_softmax", lambda_softmax), ("lambda_lse", lambda_lse)):
            if not value > 0:
                raise ValueError(f"{name} is an inverse temperature and must be positive, got {value}.")
        self.lambda_softmax = float(lambda_softmax)
        self.agg_func = agg_func
        self.lambda_lse = float(lambda_lse)
        self.raw_feature_norm = raw_feature_norm

    def pairwise(self, img: Embeddings, txt: Embeddings) -> torch.Tensor:
        return xattn_scores(
            img.tokens, img.mask, txt.tokens, txt.mask, self.direction,
            self.lambda_softmax, self.agg_func, self.lambda_lse, self.raw_feature_norm,
        )

    def extra_repr(self) -> str:
        lse = f", lambda_lse={self.lambda_lse}" if self.agg_func == "LogSumExp" else ""
        return f"lambda_softmax={self.lambda_softmax}, agg_func={self.agg_func!r}{lse}, raw_feature_norm={self.raw_feature_norm!r}"


class ScanT2IPooler(StackedCrossAttentionPooler):
    """Text-Image Stacked Cross Attention (SCAN t-i): each word attends over the regions,
    and the word relevances are pooled.

    Example:
        >>> regions = Embeddings(torch.eye(2)[None], torch.ones(1, 2, dtype=torch.bool))
        >>> word = Embeddings(torch.tensor([[[0.6, 0.8]]]), torch.ones(1, 1, dtype=torch.bool))
        >>> ScanT2IPooler(agg_func="Mean")(regions, word)  # cos(e, (v1 + v2) / 2)
        tensor([[0.9899]])
    """

    direction = "t2i"


class ScanI2TPooler(StackedCrossAttentionPooler):
    """Image-Text Stacked Cross Attention (SCAN i-t): each region attends over the words,
    and the region relevances are pooled.

    Example:
        >>> regions = Embeddings(torch.eye(2)[None], torch.ones(1, 2, dtype=torch.bool))
        >>> word = Embeddings(torch.tensor([[[0.6, 0.8]]]), torch.ones(1, 1, dtype=torch.bool))
        >>> ScanI2TPooler(lambda_softmax=4.0, agg_func="Mean")(regions, word)  # mean(cos(v_r, e))
        tensor([[0.7000]])
    """

    direction = "i2t"


class SumMaxT2IPooler(_ScanPooler):
    """Sum-Max baseline, text-image: sum over words of the best region score.

    Example:
        >>> e = Embeddings(torch.eye(2)[None], torch.ones(1, 2, dtype=torch.bool))
        >>> SumMaxT2IPooler()(e, e)
        tensor([[2.]])
    """

    direction = "t2i"

    def pairwise(self, img: Embeddings, txt: Embeddings) -> torch.Tensor:
        return sum_max_scores(img.tokens, img.mask, txt.tokens, txt.mask, self.direction)


class SumMaxI2TPooler(SumMaxT2IPooler):
    """Sum-Max baseline, image-text: sum over regions of the best word score.

    Example:
        >>> e = Embeddings(torch.eye(2)[None], torch.ones(1, 2, dtype=torch.bool))
        >>> SumMaxI2TPooler()(e, e)
        tensor([[2.]])
    """

    direction = "i2t"
