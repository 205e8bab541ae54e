"""Typed image inputs and training batches: what collate makes and the model reads.

An image encoder reads one of two kinds of input and says which by its ``input_type``:

- :class:`RegionInputs`: precomputed region features ``[B, R, F]``, their boxes ``[B, R, 4]``
  normalised to [0, 1], and a mask ``[B, R]`` (True = real region);
- :class:`PixelInputs`: the pictures themselves (PIL images, paths, uint8 arrays, or one
  preprocessed float tensor ``[B, 3, H, W]``).

A :class:`RegionInputs` is checked once, when it is made (shapes, dtypes, and values: NaN,
images without regions, boxes outside [0, 1]); moving or slicing it keeps it checked, so the
encoders do not check it again. Made on the CPU (as :func:`xmatch.data.collate` does), the
value checks never wait for a GPU.

:class:`PairBatch` (training: images paired one to one with captions) and :class:`ImageBatch`
(images alone, for evaluation and indexing) are the batches of :func:`xmatch.data.collate` and
:func:`xmatch.data.collate_images`.

Example:
    >>> inputs = RegionInputs(torch.rand(2, 3, 8), torch.tensor([0.1, 0.2, 0.5, 0.9]).expand(2, 3, 4))
    >>> len(inputs), inputs.mask.all().item(), inputs[1:].regions.shape
    (2, True, torch.Size([1, 3, 8]))
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

if TYPE_CHECKING:
    from xmatch.model.interfaces import TokenBatch

Index = int | slice | torch.Tensor


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


def check_region_shapes(
    regions: torch.Tensor, boxes: torch.Tensor, mask: torch.Tensor | None, feature_dim: int | None = None
) -> torch.Tensor:
    """Check the types and shapes of region inputs (no value is read, so nothing waits for a
    device) and return the mask, all True when not given.

    Args:
        regions: ``[B, R, F]`` floating-point region features.
        boxes: ``[B, R, 4]`` boxes.
        mask: ``[B, R]`` bool, True for real regions, or None.
        feature_dim: the width ``F`` the encoder reads (None: any).

    Example:
        >>> check_region_shapes(torch.rand(1, 2, 4), torch.zeros(1, 2, 4), None).tolist()
        [[True, True]]
    """
    if not isinstance(regions, torch.Tensor) or not isinstance(boxes, torch.Tensor):
        raise TypeError("regions and boxes must be torch tensors ([B, R, F] and [B, R, 4]).")
    if regions.dim() != 3:
        raise ValueError(
            f"regions must be [batch, regions, features], got shape {tuple(regions.shape)}; "
            "add a batch axis with regions.unsqueeze(0) for a single image."
        )
    if feature_dim is not None:
        check_feature_dim(regions, feature_dim)
    if not regions.is_floating_point():
        raise TypeError(f"regions must be a floating-point tensor, got {regions.dtype}.")
    if boxes.shape != (*regions.shape[:2], 4):
        raise ValueError(
            f"boxes must be [batch, regions, 4] = {(*regions.shape[:2], 4)} to match the regions, "
            f"got {tuple(boxes.shape)}."
        )
    if mask is None:
        return torch.ones(regions.shape[:2], dtype=torch.bool, device=regions.device)
    if not isinstance(mask, torch.Tensor) or mask.shape != regions.shape[:2] or mask.dtype != torch.bool:
        raise ValueError(
            f"mask must be a bool tensor of shape {tuple(regions.shape[:2])} (True = real region), "
            f"got {getattr(mask, 'dtype', type(mask).__name__)} {tuple(getattr(mask, 'shape', ()))}."
        )
    return mask


def check_feature_dim(regions: torch.Tensor, feature_dim: int) -> None:
    """Check that region features are as wide as the encoder reads."""
    if regions.shape[2] != feature_dim:
        raise ValueError(
            f"regions have {regions.shape[2]} features but the image encoder expects "
            f"{feature_dim}; build the model with image_encoder={{'feature_dim': {regions.shape[2]}}} "
            "or use features of the right extractor."
        )


def check_region_values(regions: torch.Tensor, boxes: torch.Tensor, mask: torch.Tensor) -> None:
    """Check the values of shape-checked region inputs: every image has a region, real regions
    are finite, real boxes are normalised ``(x1, y1, x2, y2)``. Padded slots are not read.

    On a GPU each check waits for the device; :class:`RegionInputs` runs them where the
    inputs are made (on the CPU for batches of :func:`xmatch.data.collate`).

    Example:
        >>> check_region_values(torch.rand(1, 2, 4), torch.full((1, 2, 4), 2.0), torch.ones(1, 2, dtype=torch.bool))
        Traceback (most recent call last):
        ...
        ValueError: boxes must be normalised to [0, 1] (x1/W, y1/H, x2/W, y2/H); got values outside that range: divide pixel boxes by the image size (xmatch.normalize_boxes).
    """
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


@dataclass(frozen=True, eq=False)
class RegionInputs:
    """Images as precomputed regions, checked when made.

    Attributes:
        regions: ``[B, R, F]`` floating-point region features (padded slots may hold anything).
        boxes: ``[B, R, 4]`` boxes ``(x1, y1, x2, y2)`` normalised to [0, 1] by the image size.
        mask: ``[B, R]`` bool, True for real regions; all True when made without one.

    Each may be given as a NumPy array: it becomes a tensor sharing its memory.

    Raises:
        TypeError, ValueError: shapes, dtypes or values that no encoder can read; the message
            names the problem and the fix.

    Example:
        >>> boxes = torch.tensor([0.0, 0.0, 0.5, 0.5]).expand(2, 3, 4)
        >>> inputs = RegionInputs(torch.rand(2, 3, 8), boxes, torch.tensor([[True, True, False], [True] * 3]))
        >>> inputs.to("cpu").mask.sum().item(), len(inputs[0])
        (5, 1)
    """

    regions: torch.Tensor
    boxes: torch.Tensor
    mask: torch.Tensor = None  # type: ignore[assignment]  # filled in (all True) when not given

    def __post_init__(self) -> None:
        for name in ("regions", "boxes", "mask"):  # features read from .npy files: taken without a copy
            if isinstance(getattr(self, name), np.ndarray):
                object.__setattr__(self, name, torch.from_numpy(getattr(self, name)))
        mask = check_region_shapes(self.regions, self.boxes, self.mask)
        check_region_values(self.regions, self.boxes, mask)
        object.__setattr__(self, "mask", mask)

    @classmethod
    def _checked(cls, regions: torch.Tensor, boxes: torch.Tensor, mask: torch.Tensor) -> RegionInputs:
        """A record of tensors taken from a checked one (moved or sliced): not checked again."""
        out = object.__new__(cls)
        object.__setattr__(out, "regions", regions)
        object.__setattr__(out, "boxes", boxes)
        object.__setattr__(out, "mask", mask)
        return out

    def __len__(self) -> int:
        return self.regions.shape[0]

    def __getitem__(self, index: Index) -> RegionInputs:
        if isinstance(index, int):
            index = slice(index, index + 1 if index != -1 else None)
        return RegionInputs._checked(self.regions[index], self.boxes[index], self.mask[index])

    @property
    def device(self) -> torch.device:
        return self.regions.device

    def to(self, device: torch.device | str, non_blocking: bool = False) -> RegionInputs:
        """The same inputs on ``device`` (dtypes kept; the encoder casts the features)."""
        return RegionInputs._checked(
            self.regions.to(device, non_blocking=non_blocking),
            self.boxes.to(device, non_blocking=non_blocking),
            self.mask.to(device, non_blocking=non_blocking),
        )

    def pin_memory(self) -> RegionInputs:
        """Page-locked copies (``DataLoader(pin_memory=True)`` calls it), for asynchronous copies to a GPU."""
        return RegionInputs._checked(self.regions.pin_memory(), self.boxes.pin_memory(), self.mask.pin_memory())


@dataclass(frozen=True, eq=False)
class PixelInputs:
    """Images as pictures, for encoders that take pixels.

    Attributes:
        images: a list of PIL images, image paths or uint8 ``[H, W, 3]`` arrays (a stack of
            them ``[B, H, W, 3]`` becomes a list), or one float tensor ``[B, 3, H, W]`` already
            preprocessed for the encoder's backbone.

    Example:
        >>> from PIL import Image
        >>> inputs = PixelInputs([Image.new("RGB", (8, 8)), Image.new("RGB", (4, 6))])
        >>> len(inputs), len(inputs[1:].images)
        (2, 1)
    """

    images: Sequence[Any] | torch.Tensor

    def __post_init__(self) -> None:
        images = self.images
        if isinstance(images, torch.Tensor):
            if images.dim() != 4 or not images.is_floating_point():
                raise ValueError(
                    f"a pixel tensor must be float [batch, 3, height, width] (the encoder's preprocess makes one), "
                    f"got {images.dtype} {tuple(images.shape)}; or pass a list of PIL images."
                )
        elif isinstance(images, np.ndarray) and images.ndim == 4:  # a stack of uint8 [H, W, 3] pictures
            object.__setattr__(self, "images", list(images))
        elif isinstance(images, (str, bytes)) or not isinstance(images, Sequence):
            raise TypeError(
                f"images must be a list of pictures (PIL images, paths, uint8 arrays) or a float tensor "
                f"[B, 3, H, W], got {type(images).__name__}; wrap a single picture in a list."
            )
        else:
            object.__setattr__(self, "images", list(images))

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int | slice) -> PixelInputs:
        if isinstance(index, int):
            index = slice(index, index + 1 if index != -1 else None)
        return PixelInputs(self.images[index])

    def to(self, device: torch.device | str, non_blocking: bool = False) -> PixelInputs:
        """A pixel tensor moved to ``device``; pictures stay where they are (the encoder reads them)."""
        if isinstance(self.images, torch.Tensor):
            return PixelInputs(self.images.to(device, non_blocking=non_blocking))
        return self

    def pin_memory(self) -> PixelInputs:
        return PixelInputs(self.images.pin_memory()) if isinstance(self.images, torch.Tensor) else self


ImageInputs = RegionInputs | PixelInputs
"""What an image encoder reads: :class:`RegionInputs` or :class:`PixelInputs`."""


def input_type_of(encoder: Any) -> type[RegionInputs | PixelInputs]:
    """The input an image encoder (instance, class or registered builder) reads.

    Encoders declare it with ``input_type``; a builder that declares none reads
    :class:`RegionInputs`.

    Example:
        >>> from xmatch.components.image.bottomup import BottomUpImageEncoder
        >>> input_type_of(BottomUpImageEncoder).__name__
        'RegionInputs'
    """
    declared = getattr(encoder, "input_type", None)
    return declared if declared in (RegionInputs, PixelInputs) else RegionInputs


@dataclass(frozen=True, eq=False)
class PairBatch:
    """A training batch: image ``k`` goes with caption ``k``.

    Attributes:
        images: :class:`RegionInputs` or :class:`PixelInputs` of the ``B`` images.
        texts: the ``B`` captions, or a TokenBatch of them.
        image_ids: LongTensor ``[B]``, the image index (same id = same image: not a negative).
        indices: LongTensor ``[B]``, the caption index in the dataset.

    Example:
        >>> images = RegionInputs(torch.rand(2, 3, 8), torch.zeros(2, 3, 4))
        >>> batch = PairBatch(images, ["a dog", "a cat"], image_ids=torch.tensor([0, 1]))
        >>> len(batch), batch.to("cpu").images.regions.shape
        (2, torch.Size([2, 3, 8]))
    """

    images: ImageInputs
    texts: list[str] | TokenBatch
    image_ids: torch.Tensor | None = None
    indices: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.images, (RegionInputs, PixelInputs)):
            raise TypeError(
                f"PairBatch.images must be RegionInputs or PixelInputs, got {type(self.images).__name__}."
            )
        if isinstance(self.texts, str):
            raise TypeError("PairBatch.texts is a list of captions; wrap a single one in a list.")
        if len(self.images) != len(self.texts):
            raise ValueError(
                f"a training batch pairs images with captions one to one; got {len(self.images)} images "
                f"and {len(self.texts)} captions."
            )

    def __len__(self) -> int:
        return len(self.images)

    def to(self, device: torch.device | str, non_blocking: bool = False) -> PairBatch:
        """The batch with its tensors on ``device`` (captions as strings stay as they are)."""
        texts = self.texts if isinstance(self.texts, list) else self.texts.to(device)
        return PairBatch(
            self.images.to(device, non_blocking=non_blocking),
            texts,
            None if self.image_ids is None else self.image_ids.to(device, non_blocking=non_blocking),
            None if self.indices is None else self.indices.to(device, non_blocking=non_blocking),
        )

    def pin_memory(self) -> PairBatch:
        return PairBatch(
            self.images.pin_memory(),
            self.texts,
            None if self.image_ids is None else self.image_ids.pin_memory(),
            None if self.indices is None else self.indices.pin_memory(),
        )


@dataclass(frozen=True, eq=False)
class ImageBatch:
    """Images alone (evaluation and indexing encode each image once).

    Attributes:
        images: :class:`RegionInputs` or :class:`PixelInputs`.
        image_ids: LongTensor ``[B]``, the images' indices in the dataset.

    Example:
        >>> batch = ImageBatch(RegionInputs(torch.rand(2, 3, 8), torch.zeros(2, 3, 4)), torch.tensor([4, 7]))
        >>> len(batch), batch.image_ids.tolist()
        (2, [4, 7])
    """

    images: ImageInputs
    image_ids: torch.Tensor | None = None

    def __len__(self) -> int:
        return len(self.images)

    def to(self, device: torch.device | str, non_blocking: bool = False) -> ImageBatch:
        ids = None if self.image_ids is None else self.image_ids.to(device, non_blocking=non_blocking)
        return ImageBatch(self.images.to(device, non_blocking=non_blocking), ids)

    def pin_memory(self) -> ImageBatch:
        return ImageBatch(self.images.pin_memory(), None if self.image_ids is None else self.image_ids.pin_memory())

