"""Bottom-up region encoder of TERN / TERAN (Messina et al., ICPR 2020; ACM TOMM 2021).

Each region feature is concatenated with its normalised box ``(x1, y1, x2, y2, area)`` and
passed through Linear-ReLU-Linear, whose output replaces the feature (no residual); a
transformer stack then contextualises the regions. With ``cls_slot`` an all-zero slot (zero
feature, zero box) is prepended as the image CLS, exactly as the original collate does.
"""

from __future__ import annotations

import torch
from torch import nn

from xmatch.components.base import EncoderOutput, ImageEncoder
from xmatch.components.reasoners import TransformerReasoner
from xmatch.deprecation import renamed_names


def normalize_boxes(boxes_xyxy: torch.Tensor, sizes_wh: torch.Tensor) -> torch.Tensor:
    """Divide pixel boxes ``[..., R, 4]`` by ``[W, H, W, H]`` of each image ``[..., 2]``.

    The division runs in float64 and the result is float32, as in the original loader.

    Example:
        >>> normalize_boxes(torch.tensor([[[10., 20., 50., 40.]]]), torch.tensor([[100, 80]]))
        tensor([[[0.1000, 0.2500, 0.5000, 0.5000]]])
    """
    sizes = torch.as_tensor(sizes_wh, dtype=torch.float64)
    scale = torch.cat([sizes, sizes], dim=-1).unsqueeze(-2)
    return (torch.as_tensor(boxes_xyxy, dtype=torch.float64) / scale).float()


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
        self, regions: torch.Tensor, boxes: torch.Tensor, mask: torch.Tensor | None = None
    ) -> EncoderOutput:
        mask = check_region_inputs(regions, boxes, mask, self.feature_dim)
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
        return EncoderOutput(x, mask, content, global_slot=self.cls_slot)

    @property
    def dtype(self) -> torch.dtype:
        return self.box_conditioning.map[0].weight.dtype


class RegionFeaturesImageEncoder(ImageEncoder):
    """Precomputed region features handed on as they are, padded slots zeroed: the base of
    encoders whose paper maps regions with the model's projection alone (SCAN's
    ``EncoderImagePrecomp``, OAN's regions, VSE++'s precomputed features).

    Inputs are those of the ``bottomup`` encoder (regions ``[B, R, F]``, boxes ``[B, R, 4]``,
    mask), checked by :func:`check_region_inputs`; boxes may be left out (full-image boxes
    stand in, for models without geometry). Subclasses that reduce the regions further call
    :meth:`real_regions` in their own ``forward``.

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
        self, regions: torch.Tensor, boxes: torch.Tensor | None, mask: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Checked ``regions`` with padded slots zeroed (so what they held never leaks), and the mask."""
        if boxes is None and isinstance(regions, torch.Tensor):
            boxes = regions.new_tensor([0.0, 0.0, 1.0, 1.0]).expand(*regions.shape[:2], 4)
        mask = check_region_inputs(regions, boxes, mask, self.feature_dim)
        return regions.masked_fill(~mask.unsqueeze(-1), 0.0), mask

    def forward(
        self, regions: torch.Tensor, boxes: torch.Tensor | None = None, mask: torch.Tensor | None = None
    ) -> EncoderOutput:
        """Every real region is a token that takes part in the alignment."""
        tokens, mask = self.real_regions(regions, boxes, mask)
        return EncoderOutput(tokens, mask, mask.clone(), global_slot=False)


def check_region_inputs(
    regions: torch.Tensor, boxes: torch.Tensor, mask: torch.Tensor | None, feature_dim: int
) -> torch.Tensor:
    """Validate region inputs and return the mask (all True when not given)."""
    if not isinstance(regions, torch.Tensor) or not isinstance(boxes, torch.Tensor):
        raise TypeError("regions and boxes must be torch tensors ([B, R, F] and [B, R, 4]).")
    if regions.dim() != 3:
        raise ValueError(
            f"regions must be [batch, regions, features], got shape {tuple(regions.shape)}; "
            "add a batch axis with regions.unsqueeze(0) for a single image."
        )
    if regions.shape[2] != feature_dim:
        raise ValueError(
            f"regions have {regions.shape[2]} features but the image encoder expects "
            f"{feature_dim}; build the model with image_encoder={{'feature_dim': {regions.shape[2]}}} "
            "or use features of the right extractor."
        )
    if not regions.is_floating_point():
        raise TypeError(f"regions must be a floating-point tensor, got {regions.dtype}.")
    if boxes.shape != (*regions.shape[:2], 4):
        raise ValueError(
            f"boxes must be [batch, regions, 4] = {(*regions.shape[:2], 4)} to match the regions, "
            f"got {tuple(boxes.shape)}."
        )
    if mask is None:
        mask = torch.ones(regions.shape[:2], dtype=torch.bool, device=regions.device)
    elif mask.shape != regions.shape[:2] or mask.dtype != torch.bool:
        raise ValueError(
            f"mask must be a bool tensor of shape {tuple(regions.shape[:2])} (True = real region), "
            f"got {mask.dtype} {tuple(mask.shape)}."
        )
    if regions.shape[1] == 0 or not bool(mask.any(dim=1).all()):
        empty = (~mask.any(dim=1)).nonzero().flatten().tolist() if regions.shape[1] else "all"
        raise ValueError(f"images {empty} have zero regions; every image needs at least one region.")
    real = mask.unsqueeze(-1)
    if not bool(torch.isfinite(regions).masked_fill(~real, True).all()):
        bad = (~torch.isfinite(regions) & real).any(dim=2).any(dim=1).nonzero().flatten().tolist()
        raise ValueError(f"region features of images {bad} contain NaN or inf; fix the feature files.")
    b = boxes.masked_fill(~real, 0.0)
    if not bool(torch.isfinite(b).all()) or bool((b < 0).any()) or bool((b > 1).any()):
        raise ValueError(
            "boxes must be normalised to [0, 1] (x1/W, y1/H, x2/W, y2/H); got values outside that "
            "range: divide pixel boxes by the image size (xmatch.normalize_boxes)."
        )
    if bool((b[..., 2] < b[..., 0]).any()) or bool((b[..., 3] < b[..., 1]).any()):
        raise ValueError("boxes must be (x1, y1, x2, y2) with x2 >= x1 and y2 >= y1; some are not.")
    return mask


# the class names before they followed <Name><Kind>
__getattr__ = renamed_names(__name__, {"BottomUpEncoder": "BottomUpImageEncoder"})
