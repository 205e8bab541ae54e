"""The settings of region features, written once: :class:`RoIConfig`.

``xmatch extract`` (its flags), :class:`~xmatch.regions.pipeline.RegionPipeline`, the
``pixel-regions`` image encoder (its ``roi`` table) and the manifest ``extract.json`` all hold
the same settings; this is where their defaults and their checks live.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

#: ``weights`` value for a seeded random initialisation (tests: such features mean nothing)
RANDOM_WEIGHTS = "random"
#: ``weights`` value that picks the packaged offline weights of the backbone
AUTO_WEIGHTS = "auto"
RESIZE_MODES = ("shorter", "square")
#: ``"roi"``: pool the backbone's map of the whole picture over each box (bottom-up attention);
#: ``"crop"``: cut each box out, resize it to ``crop_size`` and encode it alone; ``"mixed"``: crop
#: the proposer's first ``crop_regions`` boxes (its best), pool the others from the map
REGION_MODES = ("roi", "crop", "mixed")
OUTPUT_STRIDES = (8, 16, 32)
#: ``"float32"``: today's features; ``"bfloat16"``: faster on CPUs with bfloat16 instructions and on GPUs, features differ slightly
COMPUTE_DTYPES = ("float32", "bfloat16")
@dataclass(frozen=True)
class RoIConfig:
    """How region features are computed: the backbone and its weights, the resizing, the pooling.

    Attributes:
        backbone: a timm model name with a spatial feature map.
        weights: ``"auto"`` (the packaged offline weights of the backbone:
            ``package:efficientnet-lite0`` / ``-lite1`` / ``-lite2``), a local ``.safetensors`` /
            ``.pth`` file, ``package:<module>/<path>``, or ``"random"`` (seeded by ``seed``).
        pretrained: timm's own weights from its hub instead (needs the network or its cache).
        image_size: target of the shorter side: 600, the bottom-up convention (None: the
            pretrained config's input size, 224 for EfficientNet-Lite0; a ViT needs its own).
        max_size: cap on the longer side (None: twice ``image_size``).
        resize: ``"shorter"`` (keep the aspect ratio) or ``"square"`` (squash; ViTs).
        pool_bins: RoI-align bins per side, averaged (the scenes benchmark's 2).
        pool_samples: bilinear samples per bin side (0: adaptive; the scenes benchmark's 2).
        seed: seed of a random initialisation.
        output_stride: the feature map's stride, 8, 16 or 32: 16, as bottom-up attention
            pooled (None: the backbone's own, 32 for EfficientNet; a ViT has only its own). A
            stride under the backbone's dilates its last stages (timm's ``output_stride``), so
            a small object covers more map cells with the same weights. The defaults come from
            docs/extract.md's table: objects of 16-40 px reach rsum 504 at 600 px on a stride-16
            map against 340 at 224 px on the stride-32 one.
        mode: ``"roi"`` pools the map of the whole picture over each box; ``"crop"`` cuts each
            box out of the resized picture, resizes it to ``crop_size`` x ``crop_size``
            (RoI-align over the pixels) and averages the backbone's map of the crop alone, so
            neighbouring objects do not leak into a small box. ``"mixed"`` crops only the
            proposer's first ``crop_regions`` boxes (a proposer lists its most object-like boxes
            first) and pools the others from the map of the whole picture: object resolution
            for a few boxes at a fraction of the CPU of cropping them all.
        crop_size: side of a crop in ``"crop"`` and ``"mixed"`` mode.
        crop_regions: boxes cropped per picture in ``"mixed"`` mode (the proposer's first).
        compute_dtype: the backbone's arithmetic, ``"float32"`` or ``"bfloat16"`` (the weights
            and the pixels cast; the map is pooled in float32). On a CPU with AVX512-BF16 or AMX
            (``lscpu`` lists ``avx512_bf16`` / ``amx_bf16``) bfloat16 gives 2x the float32
            images/s at 600 px and 1.5x at 224 px, but the features are not float32's: on photos
            their cosine to the float32 features is 0.998 on average, 0.991 at worst
            (docs/extract.md, Throughput). Features of one setting are not mixed with the
            other's: the manifest records it, and a resume must use the same.

    Raises:
        ValueError: a setting out of its range (the message names it and what it accepts).
        TypeError: a setting of the wrong type (e.g. ``image_size="224"``).

    Example:
        >>> roi = RoIConfig()
        >>> roi.backbone, roi.weights, roi.image_size, roi.output_stride, roi.pool_bins
        ('efficientnet_lite0', 'auto', 600, 16, 2)
        >>> RoIConfig("vit_small_patch16_224", resize="square", image_size=None, output_stride=None).image_size is None
        True
        >>> RoIConfig(resize="crop")
        Traceback (most recent call last):
        ...
        ValueError: resize must be one of shorter, square, got 'crop'.
    """

    backbone: str = "efficientnet_lite0"
    weights: str = AUTO_WEIGHTS
    pretrained: bool = False
    image_size: int | None = 600
    max_size: int | None = None
    resize: str = "shorter"
    pool_bins: int = 2
    pool_samples: int = 2
    seed: int = 0
    output_stride: int | None = 16
    mode: str = "roi"
    crop_size: int = 96
    crop_regions: int = 8
    compute_dtype: str = "float32"

    def __post_init__(self) -> None:
        for name in ("backbone", "weights"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                raise TypeError(f"{name} must be a non-empty string, got {value!r}.")
        if not isinstance(self.pretrained, bool):
            raise TypeError(f"pretrained must be true or false, got {self.pretrained!r}.")
        optional = ("image_size", "max_size", "output_stride")
        for name in (*optional, "pool_bins", "pool_samples", "seed", "crop_size", "crop_regions"):
            value = getattr(self, name)
            if not (value is None and name in optional) and not _is_int(value):
                raise TypeError(f"{name} must be an integer, got {value!r}.")
        for name in ("image_size", "max_size"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be a positive number of pixels (or None: the default), got {value}.")
        if self.resize not in RESIZE_MODES:
            raise ValueError(f"resize must be one of {', '.join(RESIZE_MODES)}, got {self.resize!r}.")
        if self.output_stride is not None and self.output_stride not in OUTPUT_STRIDES:
            raise ValueError(
                f"output_stride must be one of {', '.join(map(str, OUTPUT_STRIDES))} (or None: the backbone's own), "
                f"got {self.output_stride}."
            )
        if self.mode not in REGION_MODES:
            raise ValueError(f"mode must be one of {', '.join(REGION_MODES)}, got {self.mode!r}.")
        if self.compute_dtype not in COMPUTE_DTYPES:
            raise ValueError(f"compute_dtype must be one of {', '.join(COMPUTE_DTYPES)}, got {self.compute_dtype!r}.")
        if self.crop_size < 16:
            raise ValueError(f"crop_size must be at least 16 pixels, got {self.crop_size}.")
        if self.crop_regions < 0:
            raise ValueError(f"crop_regions must be 0 or more boxes, got {self.crop_regions}.")
        if self.pool_bins < 1 or self.pool_samples < 0:
            raise ValueError(
                f"pool_bins must be at least 1 and pool_samples at least 0, got {self.pool_bins}, {self.pool_samples}."
            )

    @classmethod
    def from_table(cls, table: Mapping[str, Any] | None, path: str = "roi") -> RoIConfig:
        """The settings of a spec or manifest table (missing keys take their defaults).

        Raises:
            ValueError: an unknown key (close matches and every setting listed), or a bad
                value; the message starts with ``path``.
            TypeError: ``table`` is not a table, or a value of the wrong type.

        Example:
            >>> RoIConfig.from_table({"backbone": "efficientnet_lite2", "image_size": 256}).image_size
            256
            >>> RoIConfig.from_table({"pool_bin": 3})
            Traceback (most recent call last):
            ...
            ValueError: roi -> pool_bin: not a RoI setting. Did you mean 'pool_bins'? Settings: backbone, weights, pretrained, image_size, max_size, resize, pool_bins, pool_samples, seed, output_stride, mode, crop_size, crop_regions, compute_dtype.
        """
        if table is None:
            return cls()
        if not isinstance(table, Mapping):
            raise TypeError(f"{path}: expected a table of RoI settings, got {table!r}.")
        known = [f.name for f in fields(cls)]
        for key in table:
            if key not in known:
                close = difflib.get_close_matches(str(key), known, n=3)
                hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
                raise ValueError(f"{path} -> {key}: not a RoI setting.{hint} Settings: {', '.join(known)}.")
        try:
            return cls(**table)
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"{path}: {exc}") from None


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
