"""Bottom-up region encoder of TERN / TERAN (Messina et al., ICPR 2020; ACM TOMM 2021).

Each region feature is concatenated with its normalised box ``(x1, y1, x2, y2, area)`` and
passed through Linear-ReLU-Linear, whose output replaces the feature (no residual); a
transformer stack then contextualises the regions. With ``cls_slot`` an all-zero slot (zero
feature, zero box) is prepended as the image CLS, exactly as the original collate does.
"""

from __future__ import annotations

import torch
from torch import nn

from xmatch.model.interfaces import EncoderOutput, ImageEncoder
from xmatch.components.reasoners import TransformerReasoner
from xmatch.model.inputs import (
    RegionInputs,
    check_feature_dim,
    check_region_shapes,
    check_region_values,
)


def box_geometry(boxes: torch.Tensor) -> torch.Tensor:
    """``[..., 4]`` normalised boxes -> ``[..., 5]`` = (x1, y1, x2, y2, (x2-x1)(y2-y1))."""
    area = (boxes[..., 2] - boxes[..., 0]) * (boxes[..., 3] - boxes[..., 1])
    return torch.cat([boxes, area.unsqueeze(-1)], dim=-1)


class BoxConditioning(nn.Module):
    """``[feature || x1 y1 x2 y2 area] -> Linear -> ReLU -> Linear`` (the output replaces the feature)."""

    def __init__(self, feature_dim: int, hidden_dim: int) -> None:
        super().__init__()
        self.map = nn.Sequential(
            nn.Linear(feature_dim + 5, hidden_dim), nn.ReLU(), nn.Linear(hidden_dim, feature_dim)
        )

    def forward(self, features: torch.Tensor, boxes: torch.Tensor) -> torch.Tensor:
        return self.map(torch.cat([features, box_geometry(boxes)], dim=-1))


class BottomUpImageEncoder(ImageEncoder):
    """Precomputed region features + boxes -> box conditioning -> transformer stack.

    Args:
        feature_dim: width of the region features (2048 for bottom-up Faster R-CNN).
        layers: visual transformer layers (4 in the papers; 0 for none).
        heads: attention heads (4).
        ff_dim: feed-forward width (2048).
        dropout: dropout of the transformer layers (0.1).
        box_hidden_dim: hidden width of the box MLP (default ``feature_dim``).
        cls_slot: prepend the all-zero image CLS slot (TERN/TERAN); it takes part in the
            attention, becomes ``Embeddings.pooled`` and never in the alignment.

    The output carries the boxes (zeros for the CLS slot and padding): they become
    ``Embeddings.boxes``, region ``t`` of an image being its token ``t``.

    Example:
        >>> enc = BottomUpImageEncoder(feature_dim=16, layers=1)
        >>> out = enc(torch.rand(2, 5, 16), torch.tensor([[0.1, 0.1, 0.5, 0.5]]).expand(2, 5, 4))
        >>> out.tokens.shape, out.content.sum().item()
        (torch.Size([2, 6, 16]), 10)
    """

    def __init__(
        self,
        feature_dim: int = 2048,
        layers: int = 4,
        heads: int = 4,
        ff_dim: int = 2048,
        dropout: float = 0.1,
        box_hidden_dim: int | None = None,
        cls_slot: bool = True,
    ) -> None:
        super().__init__()
        self.feature_dim = feature_dim
        self.output_dim = feature_dim
        self.cls_slot = cls_slot
        self.box_conditioning = BoxConditioning(feature_dim, box_hidden_dim or feature_dim)
        self.transformer = TransformerReasoner(feature_dim, layers, heads, ff_dim, dropout)

    def forward(
        self, regions: torch.Tensor | RegionInputs, boxes: torch.Tensor | None = None, mask: torch.Tensor | None = None
    ) -> EncoderOutput:
        """Encode ``regions [B, R, F]``, ``boxes [B, R, 4]`` and ``mask [B, R]`` (checked here), or
        one :class:`~xmatch.model.inputs.RegionInputs` (checked when it was made)."""
        regions, boxes, mask = _region_tensors(regions, boxes, mask, self.feature_dim)
        if self.cls_slot:
            regions = nn.functional.pad(regions, (0, 0, 1, 0))
            boxes = nn.functional.pad(boxes, (0, 0, 1, 0))
            mask = nn.functional.pad(mask, (1, 0), value=True)
        # Padded slots go through the MLP too (as zeros, like the original collate) so the
        # outputs of real slots never depend on how the batch was padded.
        regions = regions.masked_fill(~mask.unsqueeze(-1), 0)
        boxes = boxes.masked_fill(~mask.unsqueeze(-1), 0)
        x = self.box_conditioning(regions.to(self.dtype), boxes.to(self.dtype))
        x = self.transformer(x, mask)
        content = mask.clone()
        if self.cls_slot:
            content[:, 0] = False
        return EncoderOutput(x, mask, content, global_slot=self.cls_slot, boxes=boxes.float())

    @property
    def dtype(self) -> torch.dtype:
        return self.box_conditioning.map[0].weight.dtype

    def encode(self, inputs: RegionInputs) -> EncoderOutput:  # type: ignore[override]
        return self(inputs)  # the record itself: it was checked when it was made


class RegionFeaturesImageEncoder(ImageEncoder):
    """Precomputed region features handed on as they are, padded slots zeroed: the base of
    encoders whose paper maps regions with the model's projection alone (SCAN's
    ``EncoderImagePrecomp``, OAN's regions, VSE++'s precomputed features).

    Inputs are those of the ``bottomup`` encoder (regions ``[B, R, F]``, boxes ``[B, R, 4]``,
    mask), checked by :func:`check_region_inputs`; boxes may be left out (full-image boxes
    stand in, for models without geometry). The model hands ``forward`` one checked
    :class:`~xmatch.model.inputs.RegionInputs` as ``regions``: subclasses that reduce the regions
    further pass their ``forward``'s arguments to :meth:`real_regions`, which reads both forms.

    Args:
        feature_dim: width of the region features (2048 for bottom-up Faster R-CNN).

    Example:
        >>> enc = RegionFeaturesImageEncoder(feature_dim=8)
        >>> out = enc(torch.rand(2, 3, 8), mask=torch.tensor([[True, True, False], [True] * 3]))
        >>> out.tokens.shape, out.tokens[0, 2].abs().sum().item(), out.content.sum().item()
        (torch.Size([2, 3, 8]), 0.0, 5)
    """

    def __init__(self, feature_dim: int = 2048) -> None:
        super().__init__()
        if feature_dim < 1:
            raise ValueError(f"feature_dim must be positive, got {feature_dim}.")
        self.feature_dim = feature_dim
        self.output_dim = feature_dim

    def real_regions(
        self, regions: torch.Tensor | RegionInputs, boxes: torch.Tensor | None = None, mask: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Checked ``regions`` with padded slots zeroed (so what they held never leaks), and the mask.

        ``regions`` may be a :class:`~xmatch.model.inputs.RegionInputs` (what the model hands to
        ``forward``: checked when it was made, so not checked again)."""
        if boxes is None and isinstance(regions, torch.Tensor):
            boxes = regions.new_tensor([0.0, 0.0, 1.0, 1.0]).expand(*regions.shape[:2], 4)
        regions, _, mask = _region_tensors(regions, boxes, mask, self.feature_dim)
        return regions.masked_fill(~mask.unsqueeze(-1), 0.0), mask

    def encode(self, inputs: RegionInputs) -> EncoderOutput:  # type: ignore[override]
        """``forward`` gets the record itself (checked when it was made); a subclass's
        ``forward`` hands it to :meth:`real_regions`."""
        return self(inputs)

    def forward(
        self, regions: torch.Tensor | RegionInputs, boxes: torch.Tensor | None = None, mask: torch.Tensor | None = None
    ) -> EncoderOutput:
        """Every real region is a token that takes part in the alignment (with its box, when given)."""
        given = regions.boxes if isinstance(regions, RegionInputs) else boxes
        tokens, mask = self.real_regions(regions, boxes, mask)
        kept = None if given is None else given.masked_fill(~mask.unsqueeze(-1), 0.0).float()
        return EncoderOutput(tokens, mask, mask.clone(), global_slot=False, boxes=kept)


def check_region_inputs(
    regions: torch.Tensor, boxes: torch.Tensor, mask: torch.Tensor | None, feature_dim: int
) -> torch.Tensor:
    """Validate region inputs and return the mask (all True when not given).

    For raw tensors handed to an encoder directly; inputs that come as a
    :class:`~xmatch.model.inputs.RegionInputs` were checked when it was made.

    Example:
        >>> check_region_inputs(torch.rand(1, 2, 4), torch.zeros(1, 2, 4), None, feature_dim=4).tolist()
        [[True, True]]
    """
    mask = check_region_shapes(regions, boxes, mask, feature_dim)
    check_region_values(regions, boxes, mask)
    return mask


def _region_tensors(
    regions: torch.Tensor | RegionInputs, boxes: torch.Tensor | None, mask: torch.Tensor | None, feature_dim: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Regions, boxes and mask of an encoder's inputs: a checked record's tensors (only their
    width is compared, which reads no value), or raw tensors checked here."""
    if isinstance(regions, RegionInputs):
        if boxes is not None or mask is not None:
            raise TypeError("give the region inputs either as one RegionInputs or as regions, boxes, mask; not both.")
        check_feature_dim(regions.regions, feature_dim)
        return regions.regions, regions.boxes, regions.mask
    return regions, boxes, check_region_inputs(regions, boxes, mask, feature_dim)  # type: ignore[arg-type]
