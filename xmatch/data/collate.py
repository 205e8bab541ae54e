"""Collate functions: dataset items -> the typed batches :meth:`xmatch.MatchingModel.forward`
and evaluation read (:class:`~xmatch.model.inputs.PairBatch`, :class:`~xmatch.model.inputs.ImageBatch`).

Region sets of different sizes are zero-padded to the largest in the batch and carry a
boolean mask (True = real region) in a :class:`~xmatch.model.inputs.RegionInputs`, checked here on
the CPU (so a training step on a GPU never waits for the checks); raw images stay a list of
PIL images in a :class:`~xmatch.model.inputs.PixelInputs`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from xmatch.data.errors import DataError
from xmatch.data.items import ImageItem, Pair, RegionImage
from xmatch.model.inputs import ImageBatch, ImageInputs, PairBatch, PixelInputs, RegionInputs
from xmatch.model.masks import pad_stack


def collate(pairs: Sequence[Pair]) -> PairBatch:
    """Batch (image, caption) pairs for training.

    Returns a :class:`~xmatch.model.inputs.PairBatch`: ``images`` are :class:`RegionInputs`
    (``regions [B, R, F]`` float32 and ``boxes [B, R, 4]`` normalised to [0, 1], both
    zero-padded, ``mask [B, R]`` bool, True = real region) -- or :class:`PixelInputs` (PIL
    images) for raw-image datasets --, ``texts`` (list of str), ``image_ids`` (LongTensor
    ``[B]``, the image index: same id = same image) and ``indices`` (LongTensor ``[B]``, the
    caption index).

    Raises:
        DataError: items of different feature extractors, or mixed regions and pictures.
        ValueError: no items, or region values no encoder reads (NaN, boxes outside [0, 1]).

    Example:
        >>> pairs = [Pair(RegionImage(np.ones((r, 8), np.float32), np.zeros((r, 4), np.float32)), f"caption {r}", r, r)
        ...          for r in (2, 3)]
        >>> batch = collate(pairs)  # DataLoader(dataset, batch_size=40, collate_fn=collate) calls it
        >>> batch.images.regions.shape, batch.images.mask.tolist(), batch.texts
        (torch.Size([2, 3, 8]), [[True, True, False], [True, True, True]], ['caption 2', 'caption 3'])
    """
    if not pairs:
        raise ValueError("collate needs at least one item.")
    return PairBatch(
        _image_inputs([p.image for p in pairs], [f"caption {p.index} (image {p.image_index})" for p in pairs]),
        [p.text for p in pairs],
        image_ids=torch.tensor([p.image_index for p in pairs], dtype=torch.long),
        indices=torch.tensor([p.index for p in pairs], dtype=torch.long),
    )


def collate_images(items: Sequence[ImageItem]) -> ImageBatch:
    """Batch images alone (evaluation encodes each image once).

    Returns an :class:`~xmatch.model.inputs.ImageBatch`: ``images`` as :func:`collate` makes them
    and ``image_ids`` (LongTensor ``[B]``, the image indices).

    Example:
        >>> items = [ImageItem(RegionImage(np.ones((36, 8), np.float32), np.zeros((36, 4), np.float32)), k) for k in (4, 7)]
        >>> batch = collate_images(items)  # dataset.image_loader(64) calls it on dataset.images
        >>> batch.images.mask.shape, batch.image_ids.tolist()
        (torch.Size([2, 36]), [4, 7])
    """
    if not items:
        raise ValueError("collate_images needs at least one item.")
    images = _image_inputs([it.image for it in items], [f"image {it.image_index}" for it in items])
    return ImageBatch(images, torch.tensor([it.image_index for it in items], dtype=torch.long))


def _image_inputs(images: list[Any], labels: list[str]) -> ImageInputs:
    is_regions = [isinstance(im, RegionImage) for im in images]
    if not any(is_regions):
        return PixelInputs(list(images))
    if not all(is_regions):
        raise DataError("a batch mixes precomputed regions and raw images; use items of one dataset.")
    widths = [im.regions.shape[1] for im in images]
    if len(set(widths)) > 1:
        odd = next(i for i, w in enumerate(widths) if w != widths[0])
        raise DataError(
            f"{labels[odd]} has {widths[odd]}-wide region features but {labels[0]} has {widths[0]}; "
            "all items of a batch must come from the same feature extractor."
        )
    for im, label in zip(images, labels, strict=True):
        if im.boxes.shape != (im.regions.shape[0], 4):
            raise DataError(f"{label}: boxes {im.boxes.shape} do not match its {im.regions.shape[0]} regions.")
    regions, mask = pad_stack([torch.as_tensor(im.regions, dtype=torch.float32) for im in images])
    boxes, _ = pad_stack([torch.as_tensor(im.boxes, dtype=torch.float32) for im in images])
    return RegionInputs(regions, boxes, mask)
