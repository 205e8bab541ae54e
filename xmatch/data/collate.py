"""Collate functions: dataset items -> the batch dict :meth:`xmatch.MatchingModel.forward` takes.

Region sets of different sizes are zero-padded to the largest in the batch and carry a
boolean ``region_mask`` (True = real region); raw images stay a list of PIL images.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from xmatch.data.errors import DataError
from xmatch.data.items import ImageItem, Pair, RegionImage
from xmatch.masks import pad_stack


def collate(pairs: Sequence[Pair]) -> dict[str, Any]:
    """Batch (image, caption) pairs for training.

    Returns a dict with ``regions [B, R, F]`` float32 (zero-padded), ``boxes [B, R, 4]``
    normalised to [0, 1] (zero-padded), ``region_mask [B, R]`` bool (True = real region) -- or
    ``images`` (list of PIL images) for raw-image datasets -- and ``texts`` (list of str),
    ``image_ids`` (LongTensor ``[B]``, the image index: same id = same image) and ``indices``
    (LongTensor ``[B]``, the caption index).

    Example:
        >>> pairs = [Pair(RegionImage(np.ones((r, 8), np.float32), np.zeros((r, 4), np.float32)), f"caption {r}", r, r)
        ...          for r in (2, 3)]
        >>> batch = collate(pairs)  # DataLoader(dataset, batch_size=40, collate_fn=collate) calls it
        >>> batch["regions"].shape, batch["region_mask"].tolist(), batch["texts"]
        (torch.Size([2, 3, 8]), [[True, True, False], [True, True, True]], ['caption 2', 'caption 3'])
    """
    if not pairs:
        raise ValueError("collate needs at least one item.")
    batch = _image_batch([p.image for p in pairs], [f"caption {p.index} (image {p.image_index})" for p in pairs])
    batch["texts"] = [p.text for p in pairs]
    batch["image_ids"] = torch.tensor([p.image_index for p in pairs], dtype=torch.long)
    batch["indices"] = torch.tensor([p.index for p in pairs], dtype=torch.long)
    return batch


def collate_images(items: Sequence[ImageItem]) -> dict[str, Any]:
    """Batch images alone (evaluation encodes each image once).

    Returns ``regions``, ``boxes``, ``region_mask`` (or ``images``) as :func:`collate` does,
    and ``image_ids`` (LongTensor ``[B]``, the image indices).

    Example:
        >>> items = [ImageItem(RegionImage(np.ones((36, 8), np.float32), np.zeros((36, 4), np.float32)), k) for k in (4, 7)]
        >>> batch = collate_images(items)  # dataset.image_loader(64) calls it on dataset.images
        >>> batch["region_mask"].shape, batch["image_ids"].tolist()
        (torch.Size([2, 36]), [4, 7])
    """
    if not items:
        raise ValueError("collate_images needs at least one item.")
    batch = _image_batch([it.image for it in items], [f"image {it.image_index}" for it in items])
    batch["image_ids"] = torch.tensor([it.image_index for it in items], dtype=torch.long)
    return batch


def _image_batch(images: list[Any], labels: list[str]) -> dict[str, Any]:
    is_regions = [isinstance(im, RegionImage) for im in images]
    if not any(is_regions):
        return {"images": list(images)}
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
    return {"regions": regions, "boxes": boxes, "region_mask": mask}
