"""The records a dataset hands to the collate functions."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass
class RegionImage:
    """One image as precomputed regions.

    Attributes:
        regions: ``[R, F]`` float32 region features, used as stored (no normalisation).
        boxes: ``[R, 4]`` float32 boxes ``(x1, y1, x2, y2)`` normalised to [0, 1] by the
            image width and height.

    Example:
        >>> img = RegionImage(np.zeros((36, 2048), np.float32), np.zeros((36, 4), np.float32))
        >>> img.num_regions
        36
    """

    regions: np.ndarray
    boxes: np.ndarray

    @property
    def num_regions(self) -> int:
        return int(self.regions.shape[0])


@dataclass
class Pair:
    """One training item: caption ``index`` and the image it belongs to.

    Attributes:
        image: a :class:`RegionImage`, or a ``PIL.Image.Image`` for raw-image datasets.
        text: the caption.
        image_index: index of the image in the dataset (same index = same image).
        index: index of the caption in ``dataset.captions``.
    """

    image: RegionImage | Any
    text: str
    image_index: int
    index: int


@dataclass
class ImageItem:
    """One image of the image-only view (evaluation encodes each image once).

    Attributes:
        image: a :class:`RegionImage`, or a ``PIL.Image.Image`` for raw-image datasets.
        image_index: index of the image in the dataset.
    """

    image: RegionImage | Any
    image_index: int
