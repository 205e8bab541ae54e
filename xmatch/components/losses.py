"""Losses on a square score matrix whose diagonal holds the positive pairs.

The hinge triplet loss of VSE++ (Faghri et al., 2018), used by TERN, TERAN, SCAN and OAN,
and the uncertainty weighting of several losses (Kendall et al., 2018) used by "TERN w. Align".
"""

from __future__ import annotations

import torch
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
