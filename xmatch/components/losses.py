"""Losses on a square score matrix whose diagonal holds the positive pairs.

The hinge triplet loss of VSE++ (Faghri et al., 2018), used by TERN, TERAN, SCAN and OAN,
the uncertainty weighting of several losses (Kendall et al., 2018) used by "TERN w. Align",
the symmetric contrastive (InfoNCE) loss of CLIP (Radford et al., 2021) and the pairwise
sigmoid loss of SigLIP (Zhai et al., 2023).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from xmatch.model.interfaces import Loss, LossOutput


def hinge_triplet(
    scores: torch.Tensor,
    margin: float = 0.2,
    max_violation: bool = True,
    image_ids: torch.Tensor | None = None,
) -> tuple[torch.Tensor, int]:
    """Summed hinge loss of both directions and the number of terms summed.

    ``cost_s[i, j] = [m + S[i, j] - S[i, i]]_+`` (image i as anchor) and
    ``cost_im[i, j] = [m + S[i, j] - S[j, j]]_+`` (caption j as anchor). With ``max_violation``
    only the hardest negative of every row and column counts. Pairs whose images share an id
    (two captions of one image in a batch) are not negatives when ``image_ids`` is given.
    """
    if scores.dim() != 2 or scores.shape[0] != scores.shape[1]:
        raise ValueError(
            f"the hinge loss needs a square [B, B] score matrix with positives on the diagonal, "
            f"got {tuple(scores.shape)}."
        )
    diagonal = scores.diagonal()
    cost_s = (margin + scores - diagonal[:, None]).clamp_min(0)
    cost_im = (margin + scores - diagonal[None, :]).clamp_min(0)
    positives = torch.eye(scores.shape[0], dtype=torch.bool, device=scores.device)
    if image_ids is not None:
        image_ids = torch.as_tensor(image_ids, device=scores.device)
        positives = positives | (image_ids[:, None] == image_ids[None, :])
    cost_s = cost_s.masked_fill(positives, 0)
    cost_im = cost_im.masked_fill(positives, 0)
    if max_violation:
        return cost_s.amax(dim=1).sum() + cost_im.amax(dim=0).sum(), 2 * scores.shape[0]
    return cost_s.sum() + cost_im.sum(), 2 * scores.shape[0]


class HingeTripletLoss(Loss):
    """Hinge triplet loss on ``scores[term]``, hardest negative (VSE++) or sum over negatives.

    Args:
        margin: the hinge margin (0.2).
        max_violation: only the hardest in-batch negative (True) or every negative.
        reduction: optimise the ``"sum"`` over the batch (as the papers) or the ``"mean"``
            per anchor; both are logged.
        term: which score matrix of the model to use (``"main"`` = the model's pooler).
        ignore_same_image: pairs of the same image id are not negatives.

    Example:
        >>> loss = HingeTripletLoss(margin=0.2)
        >>> loss({"main": torch.eye(3)}).loss
        tensor(0.)
    """

    def __init__(
        self,
        margin: float = 0.2,
        max_violation: bool = True,
        reduction: str = "sum",
        term: str = "main",
        ignore_same_image: bool = False,
    ) -> None:
        super().__init__()
        if reduction not in ("sum", "mean"):
            raise ValueError(f"reduction must be 'sum' or 'mean', got {reduction!r}.")
        self.margin = margin
        self.max_violation = max_violation
        self.reduction = reduction
        self.term = term
        self.ignore_same_image = ignore_same_image

    def forward(self, scores: dict[str, torch.Tensor], image_ids: torch.Tensor | None = None) -> LossOutput:
        if self.term not in scores:
            raise KeyError(f"the loss uses scores '{self.term}' but the model gives {sorted(scores)}.")
        total, count = hinge_triplet(
            scores[self.term], self.margin, self.max_violation, image_ids if self.ignore_same_image else None
        )
        mean = total / count
        logs = {f"{self.term}_sum": total.detach(), f"{self.term}_mean": mean.detach()}
        return LossOutput(total if self.reduction == "sum" else mean, logs)


class UncertaintyWeightedLoss(Loss):
    """Several hinge losses combined with learned homoscedastic-uncertainty weights.

    ``L = sum_k exp(-s_k) L_k + s_k`` with one learned ``s_k = log sigma_k^2`` per term
    (Kendall et al., CVPR 2018), as in "TERN w. Align": ``terms = ["main", "alignment"]``.

    Example:
        >>> loss = UncertaintyWeightedLoss(terms=["main", "alignment"])
        >>> loss({"main": torch.eye(2), "alignment": torch.eye(2)}).loss
        tensor(0., grad_fn=<AddBackward0>)
    """

    def __init__(
        self,
        terms: list[str] = ("main", "alignment"),
        margin: float = 0.2,
        max_violation: bool = True,
        reduction: str = "sum",
    ) -> None:
        super().__init__()
        self.terms = list(terms)
        if not self.terms:
            raise ValueError("the uncertainty loss needs at least one term.")
        self.parts = nn.ModuleList(
            HingeTripletLoss(margin, max_violation, reduction, term=t) for t in self.terms
        )
        self.log_variances = nn.Parameter(torch.zeros(len(self.terms)))

    def forward(self, scores: dict[str, torch.Tensor], image_ids: torch.Tensor | None = None) -> LossOutput:
        total = self.log_variances.new_zeros(())
        logs: dict[str, torch.Tensor | float] = {}
        for k, part in enumerate(self.parts):
            out = part(scores, image_ids)
            total = total + torch.exp(-self.log_variances[k]) * out.loss + self.log_variances[k]
            logs.update(out.logs)
            logs[f"{part.term}_log_variance"] = self.log_variances[k].detach()
        return LossOutput(total, logs)


def _same_image(scores: torch.Tensor, image_ids: torch.Tensor | None) -> torch.Tensor | None:
    """``[B, B]`` True where row and column are different pairs of one image (off the
    diagonal); None without ids."""
    if image_ids is None:
        return None
    ids = torch.as_tensor(image_ids, device=scores.device)
    eye = torch.eye(scores.shape[0], dtype=torch.bool, device=scores.device)
    return (ids[:, None] == ids[None, :]) & ~eye


def _check_square(scores: torch.Tensor, loss: str) -> None:
    if scores.dim() != 2 or scores.shape[0] != scores.shape[1]:
        raise ValueError(
            f"the {loss} loss needs a square [B, B] score matrix with positives on the diagonal, got {tuple(scores.shape)}."
        )


class InfoNCELoss(Loss):
    """CLIP's symmetric contrastive loss: cross-entropy of ``scores * scale`` over each row
    (image -> its caption) and each column (caption -> its image), averaged.

    The scale is ``exp(logit_scale)``, learned from ``1 / temperature`` (CLIP starts at
    0.07 and caps the scale at 100: ``max_scale``), or fixed. A learned ``logit_scale`` is a
    parameter of the loss: ``xmatch.build(name, pretrained=True)`` of a CLIP entry starts it
    at the checkpoint's own value (about ln 100); a fixed one is not saved with the weights.

    Args:
        temperature: the initial (or fixed) temperature; the scale is its inverse.
        learn_temperature: learn ``logit_scale`` (CLIP) or keep it fixed.
        max_scale: the largest scale used (the learned value is clamped in the forward pass).
        term: which score matrix of the model to use (``"main"`` = the model's pooler).
        ignore_same_image: two captions of one image in a batch are not each other's negatives
            (their cells leave the softmax) when the batch gives image ids.

    Example:
        >>> loss = InfoNCELoss(temperature=0.5, learn_temperature=False)
        >>> round(loss({"main": torch.eye(2)}).loss.item(), 4)  # -log(e^2 / (e^2 + 1))
        0.1269
    """

    def __init__(
        self,
        temperature: float = 0.07,
        learn_temperature: bool = True,
        max_scale: float = 100.0,
        term: str = "main",
        ignore_same_image: bool = True,
    ) -> None:
        super().__init__()
        if not temperature > 0 or not max_scale > 0:
            raise ValueError(f"temperature and max_scale must be positive, got {temperature} and {max_scale}.")
        value = torch.tensor(math.log(1 / temperature))
        if learn_temperature:
            self.logit_scale = nn.Parameter(value)
        else:
            self.register_buffer("logit_scale", value, persistent=False)
        self.max_log_scale = math.log(max_scale)
        self.term = term
        self.ignore_same_image = ignore_same_image

    def upstream_names(self, keys: set[str]) -> dict[str, str | None]:
        """A CLIP checkpoint's learned ``logit_scale`` for a learned temperature (see
        :meth:`xmatch.components.image.clip.ClipImageEncoder.upstream_names`); a fixed
        temperature takes nothing from it."""
        return {"logit_scale": "logit_scale"} if "logit_scale" in keys and isinstance(self.logit_scale, nn.Parameter) else {}

    def forward(self, scores: dict[str, torch.Tensor], image_ids: torch.Tensor | None = None) -> LossOutput:
        if self.term not in scores:
            raise KeyError(f"the loss uses scores '{self.term}' but the model gives {sorted(scores)}.")
        s = scores[self.term]
        _check_square(s, "infonce")
        scale = self.logit_scale.clamp(max=self.max_log_scale).exp()
        logits = s * scale
        same = _same_image(s, image_ids) if self.ignore_same_image else None
        if same is not None:
            logits = logits.masked_fill(same, float("-inf"))
        target = torch.arange(s.shape[0], device=s.device)
        loss = (F.cross_entropy(logits, target) + F.cross_entropy(logits.T, target)) / 2
        return LossOutput(loss, {f"{self.term}_infonce": loss.detach(), "logit_scale": scale.detach()})


class SigmoidLoss(Loss):
    """SigLIP's pairwise sigmoid loss: every (image, caption) cell of the batch is a binary
    problem, ``-log sigmoid(z * (scores * exp(t) + b))`` with ``z = 1`` for a pair and ``-1``
    otherwise, summed and divided by the batch size (Zhai et al., 2023, Algorithm 1).

    ``t`` (``logit_scale``) and ``b`` (``logit_bias``) start at ``log(scale)`` and ``bias``
    (SigLIP: ln 10 and -10) and are learned unless fixed; ``xmatch.build(name,
    pretrained=True)`` of a SigLIP entry starts learned ones at the checkpoint's values.

    Args:
        scale: the initial (or fixed) scale ``exp(t)``.
        bias: the initial (or fixed) bias ``b``.
        learn_scale, learn_bias: learn ``t`` / ``b`` or keep them fixed.
        term: which score matrix of the model to use (``"main"`` = the model's pooler).
        same_image_positive: two captions of one image in a batch are positives of each other
            (``z = 1``) when the batch gives image ids.

    Example:
        >>> loss = SigmoidLoss(scale=1.0, bias=0.0, learn_scale=False, learn_bias=False)
        >>> round(loss({"main": torch.zeros(2, 2)}).loss.item(), 4)  # 4 cells of log 2, over 2 pairs
        1.3863
    """

    def __init__(
        self,
        scale: float = 10.0,
        bias: float = -10.0,
        learn_scale: bool = True,
        learn_bias: bool = True,
        term: str = "main",
        same_image_positive: bool = True,
    ) -> None:
        super().__init__()
        if not scale > 0:
            raise ValueError(f"scale must be positive, got {scale}.")
        for name, value, learn in (("logit_scale", math.log(scale), learn_scale), ("logit_bias", bias, learn_bias)):
            if learn:
                setattr(self, name, nn.Parameter(torch.tensor(float(value))))
            else:
                self.register_buffer(name, torch.tensor(float(value)), persistent=False)
        self.term = term
        self.same_image_positive = same_image_positive

    def upstream_names(self, keys: set[str]) -> dict[str, str | None]:
        """A SigLIP checkpoint's learned ``logit_scale`` and ``logit_bias`` (shape ``[1]``
        there, ``[]`` here: see :meth:`_load_from_state_dict`) for the learned ones."""
        return {k: k for k in ("logit_scale", "logit_bias") if k in keys and isinstance(getattr(self, k), nn.Parameter)}

    def _load_from_state_dict(self, state_dict: dict[str, torch.Tensor], prefix: str, *args: object) -> None:
        # SiglipModel stores both as [1]; a scalar here
        for name in ("logit_scale", "logit_bias"):
            key = prefix + name
            if key in state_dict and state_dict[key].shape == (1,):
                state_dict[key] = state_dict[key].reshape(())
        super()._load_from_state_dict(state_dict, prefix, *args)

    def forward(self, scores: dict[str, torch.Tensor], image_ids: torch.Tensor | None = None) -> LossOutput:
        if self.term not in scores:
            raise KeyError(f"the loss uses scores '{self.term}' but the model gives {sorted(scores)}.")
        s = scores[self.term]
        _check_square(s, "sigmoid")
        logits = s * self.logit_scale.exp() + self.logit_bias
        positive = torch.eye(s.shape[0], dtype=torch.bool, device=s.device)
        same = _same_image(s, image_ids) if self.same_image_positive else None
        if same is not None:
            positive = positive | same
        signs = positive.to(logits.dtype) * 2 - 1
        loss = -F.logsigmoid(signs * logits).sum() / s.shape[0]
        return LossOutput(loss, {
            f"{self.term}_sigmoid": loss.detach(), "logit_scale": self.logit_scale.detach().exp(),
            "logit_bias": self.logit_bias.detach(),
        })
