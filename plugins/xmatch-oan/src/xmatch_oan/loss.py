"""OAN's objective (Huang et al., ICMR 2019): inter-modal hardest-negative hinge plus
intra-modal hard negatives.

Batch matrices, positives on the diagonal (and, with ``ignore_same_image``, every pair of one
image id): ``S`` (image x caption, ``r(v, t)``), ``S^V`` (image x image) and ``S^T``
(caption x caption) set-wise cosines.

``L_inter = sum_i max_j [a_inter + S_ij - S_ii]_+ + sum_j max_i [a_inter + S_ij - S_jj]_+``
(VSE++'s hinge, ``xmatch.components.losses.hinge_triplet``);

``L^V_intra = sum_i H_k [a_intra + S^V_ik - S_ii]_+``: an image must be closer to its own
caption than to any other image by ``a_intra``; ``L^T_intra`` likewise for captions. The two
sampling strategies: ``"hardest"``, ``H = max``, the intra-modal hard negative only (the
most similar other image / caption); ``"all"``, ``H = sum`` over every negative.

``L = (1 - gamma) L_inter + gamma (beta L^V_intra + (1 - beta) L^T_intra)``.
"""

from __future__ import annotations

from typing import Literal

import torch

from xmatch.plugin import Loss, LossOutput, hinge_triplet


class OANLoss(Loss):
    """``(1 - gamma) L_inter + gamma L_intra`` (see the module docstring).

    Args:
        margin_inter: ``a_inter`` (0.2).
        margin_intra: ``a_intra`` (0.1).
        beta: weight of the image side of the intra term (0.5; the caption side gets 1 - beta).
        gamma: weight of the intra term (0.3).
        intra_sampling: ``"hardest"`` (the intra-modal hard negative) or ``"all"`` negatives.
        inter_max_violation: hardest negative in the inter term (True) or every negative.
        reduction: optimise the ``"sum"`` over the batch or the ``"mean"`` per anchor.
        term, image_term, text_term: names of the score matrices (model pooler and the two
            extra poolers ``oan-intra-image`` / ``oan-intra-text``).
        ignore_same_image: pairs that share an image id are not negatives.

    Example:
        >>> loss = OANLoss()
        >>> s = {"main": torch.eye(2), "intra_image": torch.zeros(2, 2), "intra_text": torch.zeros(2, 2)}
        >>> loss(s).loss
        tensor(0.)
    """

    def __init__(
        self,
        margin_inter: float = 0.2,
        margin_intra: float = 0.1,
        beta: float = 0.5,
        gamma: float = 0.3,
        intra_sampling: Literal["hardest", "all"] = "hardest",
        inter_max_violation: bool = True,
        reduction: Literal["sum", "mean"] = "sum",
        term: str = "main",
        image_term: str = "intra_image",
        text_term: str = "intra_text",
        ignore_same_image: bool = False,
    ) -> None:
        super().__init__()
        for name, value in (("beta", beta), ("gamma", gamma)):
            if not 0 <= value <= 1:
                raise ValueError(f"loss 'oan': {name} must lie in [0, 1], got {value}.")
        if intra_sampling not in ("hardest", "all"):
            raise ValueError(f"loss 'oan': intra_sampling must be 'hardest' or 'all', got {intra_sampling!r}.")
        if reduction not in ("sum", "mean"):
            raise ValueError(f"loss 'oan': reduction must be 'sum' or 'mean', got {reduction!r}.")
        self.margin_inter = margin_inter
        self.margin_intra = margin_intra
        self.beta = beta
        self.gamma = gamma
        self.intra_sampling = intra_sampling
        self.inter_max_violation = inter_max_violation
        self.reduction = reduction
        self.terms = (term, image_term, text_term)
        self.ignore_same_image = ignore_same_image

    def _intra(self, intra: torch.Tensor, positives_scores: torch.Tensor, positives: torch.Tensor) -> torch.Tensor:
        cost = (self.margin_intra + intra - positives_scores[:, None]).clamp_min(0).masked_fill(positives, 0)
        return (cost.amax(dim=1) if self.intra_sampling == "hardest" else cost.sum(dim=1)).sum()

    def forward(self, scores: dict[str, torch.Tensor], image_ids: torch.Tensor | None = None) -> LossOutput:
        missing = [t for t in self.terms if t not in scores]
        if missing:
            raise KeyError(
                f"loss 'oan' needs the score matrices {list(self.terms)}; missing {missing} (the model gives "
                f"{sorted(scores)}). Add extra_poolers intra_image = {{name = 'oan-intra-image'}} and "
                "intra_text = {name = 'oan-intra-text'} to the spec."
            )
        s, s_image, s_text = (scores[t] for t in self.terms)
        if s.dim() != 2 or s.shape[0] != s.shape[1] or s_image.shape != s.shape or s_text.shape != s.shape:
            raise ValueError(
                f"loss 'oan' needs three square [B, B] matrices of one batch, got {tuple(s.shape)}, "
                f"{tuple(s_image.shape)} and {tuple(s_text.shape)}."
            )
        ids = image_ids if self.ignore_same_image else None
        inter, count = hinge_triplet(s, self.margin_inter, self.inter_max_violation, ids)
        positives = torch.eye(s.shape[0], dtype=torch.bool, device=s.device)
        if ids is not None:
            ids = torch.as_tensor(ids, device=s.device)
            positives = positives | (ids[:, None] == ids[None, :])
        diagonal = s.diagonal()
        intra_image = self._intra(s_image, diagonal, positives)
        intra_text = self._intra(s_text, diagonal, positives)
        intra = self.beta * intra_image + (1 - self.beta) * intra_text
        total = (1 - self.gamma) * inter + self.gamma * intra
        mean = total / count
        logs = {
            "main_sum": float(total.detach()),
            "main_mean": float(mean.detach()),
            "inter_sum": float(inter.detach()),
            "intra_image_sum": float(intra_image.detach()),
            "intra_text_sum": float(intra_text.detach()),
        }
        return LossOutput(total if self.reduction == "sum" else mean, logs)
