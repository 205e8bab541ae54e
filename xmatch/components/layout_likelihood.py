"""How likely a caption makes the layout of its grounded words: a text-to-layout density.

A discriminative head learns a relation from one bit a pair (this picture or its twin), and
which of a caption's hundred-odd word pairs carries the relation is itself to be learnt from
that bit; on the tabletop world's exact boxes the grounded head stayed at chance on "next to"
against "on top of" through 2,000 steps (docs/training.md, "Why: on exact boxes the head reads
where things lie"). Here the caption instead *predicts* the geometry of every pair of its
words' referents, a Gaussian per pair feature with its own variance, and is trained by the
likelihood of the true layout on positive pairs: every word pair of every positive caption is
a regression target, so the signal is dense, and a pair whose geometry the caption does not
state ("a" and "the") learns a wide variance and weighs little. Scoring a picture is then the
negative log-likelihood of its grounded layout, averaged over the pairs of words that name
something in it (their grounding's best similarity stands out in the caption).

The idea is text-to-layout generation (e.g. Hong et al., 2018; LayoutTransformer, Gupta et al.,
2021) turned around into a check, on top of the grounding the matching model already learnt.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn

from xmatch.components.reasoners import BOX_PAIR_FEATURES, EDGE_FEATURES, TransformerReasoner, edge_features, relative_box_features
from xmatch.components.verifier import word_positions

#: features of a pair of boxes the caption predicts: the relative geometry, the absolute centre
#: offsets (symmetric relations fix them, not their sign) and the facing edges' gaps
LAYOUT_FEATURES = BOX_PAIR_FEATURES + 2 + EDGE_FEATURES


def layout_features(boxes: torch.Tensor) -> torch.Tensor:
    """``[B, N, 4]`` boxes -> ``[B, N, N, LAYOUT_FEATURES]``, ``[b, i, j]`` describing box ``j``
    from box ``i``.

    Example:
        >>> layout_features(torch.tensor([[[0.0, 0.0, 0.2, 0.2], [0.6, 0.0, 0.8, 0.2]]])).shape
        torch.Size([1, 2, 2, 15])
    """
    relative = relative_box_features(boxes)
    return torch.cat([relative, relative[..., :2].abs(), edge_features(boxes)], dim=-1)


class LayoutFit(NamedTuple):
    """What :class:`LayoutLikelihood` gives for each row: ``surprise [n]``, the gated mean
    negative log-likelihood of the layout (lower: the caption fits the picture's layout better),
    which the head scores with; ``loss [n]``, the same mean with the gates held fixed, which
    trains the density on positive pairs."""

    surprise: torch.Tensor
    loss: torch.Tensor


class LayoutLikelihood(nn.Module):
    """A caption's density over the pairwise geometry of its words' referents.

    The words (``[n, W, dim]`` tokens, sinusoidal positions added) pass through a small pre-norm
    transformer; each ordered pair ``(i, j)`` of real words maps, through ``L(h_i) + R(h_j)``
    and an MLP, to a mean and a log-variance per feature of :func:`layout_features` (clamped
    to ``[min_log_variance, max_log_variance]``, so no pair can claim unbounded certainty). A
    pair's negative log-likelihood is the diagonal Gaussian's, without its constant; training
    takes each feature's term times its detached variance to the power ``beta`` (beta-NLL),
    without which the means hardly move (a toy "left of / right of" stayed at 57 % after 300
    steps with ``beta = 0``; with ``beta = 1/2`` it reaches 100 % after 150 steps on 8 of 9
    seeds, by 200 on the ninth). Each word gets a gate ``sigmoid(k z + b)``, where ``z`` is
    its grounding's best similarity standardised over the caption's real words (``k``, ``b``
    learned): the words that name something ground far better than "a" and "is". The pairs
    are weighed by the product of their words' gates.

    Args:
        dim: the width of the word tokens.
        width: the encoder's width.
        layers: encoder layers.
        heads: attention heads.
        min_log_variance, max_log_variance: the clamp of the predicted log-variances.

    Example:
        >>> layout = LayoutLikelihood(dim=16)
        >>> tokens, mask = torch.randn(2, 5, 16), torch.ones(2, 5, dtype=torch.bool)
        >>> boxes = torch.rand(2, 5, 2).repeat(1, 1, 2) + torch.tensor([0.0, 0.0, 0.1, 0.1])
        >>> fit = layout(tokens, mask, boxes, best=torch.rand(2, 5))
        >>> fit.surprise.shape, fit.loss.shape
        (torch.Size([2]), torch.Size([2]))
    """

    def __init__(self, dim: int, width: int = 64, layers: int = 2, heads: int = 4,
                 min_log_variance: float = -8.0, max_log_variance: float = 6.0) -> None:
        super().__init__()
        if width < 1 or layers < 1 or heads < 1 or width % heads:
            raise ValueError(f"layout likelihood: width {width} must be >= 1 and divisible by heads {heads}; layers {layers} >= 1.")
        if not min_log_variance < max_log_variance:
            raise ValueError(f"layout likelihood: min_log_variance {min_log_variance} must be below max_log_variance {max_log_variance}.")
        self.width = width
        self.min_log_variance, self.max_log_variance = min_log_variance, max_log_variance
        self.word_in = nn.Linear(dim, width)
        self.encoder = TransformerReasoner(width, layers=layers, heads=heads, ff_dim=2 * width, dropout=0.0, norm_first=True)
        self.left, self.right = nn.Linear(width, width), nn.Linear(width, width)
        self.pair = nn.Sequential(nn.ReLU(), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 2 * LAYOUT_FEATURES))
        self.gate_slope = nn.Parameter(torch.tensor(4.0))
        self.gate_offset = nn.Parameter(torch.tensor(0.0))

    def gates(self, best: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """``[n, W]`` weights in (0, 1) of the real words (0 on padding) from their best
        grounding similarities ``best [n, W]``."""
        real = mask.to(best.dtype)
        count = real.sum(1, keepdim=True).clamp_min(1)
        mean = (best * real).sum(1, keepdim=True) / count
        spread = (((best - mean) ** 2 * real).sum(1, keepdim=True) / count).sqrt().clamp_min(1e-3)
        return torch.sigmoid(self.gate_slope * (best - mean) / spread + self.gate_offset) * real

    def forward(self, tokens: torch.Tensor, mask: torch.Tensor, boxes: torch.Tensor, best: torch.Tensor,
                beta: float = 0.5) -> LayoutFit:
        """``tokens [n, W, dim]``, ``mask [n, W]``, each word's referent box ``boxes [n, W, 4]``
        (zeros: none) and its grounding's best similarity ``best [n, W]`` -> a :class:`LayoutFit`
        (its ``loss`` weighted by ``beta``, its ``surprise`` the plain likelihood)."""
        n, words = mask.shape
        h = self.word_in(tokens) + word_positions(words, self.width, tokens.device).to(tokens.dtype)
        h = self.encoder(h, mask)
        mean, log_variance = self.pair(self.left(h)[:, :, None] + self.right(h)[:, None, :]).float().chunk(2, dim=-1)
        log_variance = log_variance.clamp(self.min_log_variance, self.max_log_variance)
        error = layout_features(boxes) - mean
        terms = 0.5 * (error.square() * (-log_variance).exp() + log_variance)
        nll = terms.sum(-1)
        # beta-NLL (Seitzer et al., 2022; beta = 1/2): the plain NLL scales a mean's gradient by
        # its precision, so a pair still far off grows its variance instead of moving its mean
        fitted = (terms * (beta * log_variance.detach()).exp()).sum(-1)
        has_box = mask & (boxes != 0).any(-1)
        pairs = has_box[:, :, None] & has_box[:, None, :] & ~torch.eye(words, dtype=torch.bool, device=mask.device)
        gate = self.gates(best.float(), has_box)
        weight = gate[:, :, None] * gate[:, None, :] * pairs
        # a caption without two boxed words has no layout to check: surprise 0, no loss
        surprise = (weight * nll).sum((1, 2)) / weight.sum((1, 2)).clamp_min(1e-6)
        held = weight.detach()
        loss = (held * fitted).sum((1, 2)) / held.sum((1, 2)).clamp_min(1e-6)
        return LayoutFit(surprise, loss)
