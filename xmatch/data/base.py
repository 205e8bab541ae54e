"""The structure every dataset layout shares: images, captions ordered image by image, a
pair view for training and an image-only view for evaluation."""

from __future__ import annotations

import operator
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
from torch.utils.data import DataLoader, Dataset

from xmatch.data.collate import collate, collate_images
from xmatch.model.inputs import ImageBatch
from xmatch.data.items import ImageItem, Pair, RegionImage


class ImageTextDataset(Dataset[Pair]):
    """Images and their captions; indexing gives (image, caption) pairs.

    ``len(dataset)`` is the number of captions and ``dataset[k]`` is a :class:`Pair`: the
    image of caption ``k``, the caption and the image index, so one epoch visits every
    image once per caption (as the original loaders do). Evaluation uses
    :meth:`image_batches` instead, which reads every image once.

    Attributes:
        root: the dataset folder (or captions file).
        split: the split read.
        captions: every caption, ordered image by image.
        caption_image: ``int64 [n_captions]``, the image index of each caption.
        image_names: one name per image (feature id, row number or file path).
        captions_per_image: the number of captions of every image when it is the same for
            all (5 for COCO and Flickr30k), else None; 0 for images read alone (no captions,
            no training pairs: for encoding the image side).

    Subclasses call :meth:`_set_index` once and implement :meth:`image`.

    Example:
        >>> ds = xmatch.data.open_dataset("scan-precomp", "data/f30k_precomp", split="test")  # needs the Flickr30k precomp features on disk  # doctest: +SKIP
        >>> len(ds), ds.num_images, ds.captions_per_image  # doctest: +SKIP
        (5000, 1000, 5)
        >>> ds[7].image_index, ds.caption_image[7]  # doctest: +SKIP
        (1, 1)
    """

    root: Path
    split: str | None
    captions: list[str]
    caption_image: np.ndarray
    image_names: list[str]
    captions_per_image: int | None

    def _set_index(
        self, captions: list[str], caption_image: np.ndarray, image_names: list[str], *, images_only: bool = False
    ) -> None:
        """Record the captions (image by image) and the image of each; ``images_only``: the
        images read alone, with no captions at all (to encode the image side, e.g. for a
        search index), ``captions_per_image`` 0."""
        caption_image = np.asarray(caption_image, dtype=np.int64)
        if len(caption_image) != len(captions):
            raise ValueError(f"{len(captions)} captions but {len(caption_image)} caption->image entries.")
        if images_only:
            if len(captions):
                raise ValueError(f"images read alone have no captions, got {len(captions)}.")
            counts = np.zeros(len(image_names), dtype=np.int64)
        else:
            counts = np.bincount(caption_image, minlength=len(image_names)) if len(caption_image) else np.zeros(0, int)
            if len(counts) != len(image_names) or (counts == 0).any() or (np.diff(caption_image) < 0).any():
                raise ValueError("captions must be ordered image by image and every image needs at least one caption.")
        caption_image.setflags(write=False)
        self.captions = captions
        self.caption_image = caption_image
        self.image_names = image_names
        self.captions_per_image = int(counts[0]) if len(counts) and (counts == counts[0]).all() else None

    @property
    def num_images(self) -> int:
        """The number of images."""
        return len(self.image_names)

    def __len__(self) -> int:
        return len(self.captions)

    def image(self, index: int) -> RegionImage | Any:
        """Image ``index``: a :class:`RegionImage` (precomputed regions) or a PIL image."""
        raise NotImplementedError(f"{type(self).__name__} must implement image()")  # pragma: no cover

    def _pair_image(self, caption_index: int) -> RegionImage | Any:
        """The image that goes with caption ``caption_index`` in a training pair."""
        return self.image(int(self.caption_image[caption_index]))

    def __getitem__(self, index: int) -> Pair:
        k = check_index(index, len(self.captions), "caption")
        return Pair(self._pair_image(k), self.captions[k], int(self.caption_image[k]), k)

    @property
    def images(self) -> ImageView:
        """The images alone, as a map-style dataset of :class:`ImageItem` (one per image)."""
        return ImageView(self)

    def loader(self, batch_size: int, *, shuffle: bool = True, num_workers: int = 0, **kwargs: Any) -> DataLoader:
        """A DataLoader of training pairs batched by :func:`xmatch.data.collate`.

        Example:
            >>> for batch in ds.loader(40):  # needs a dataset and a model  # doctest: +SKIP
            ...     model(batch).loss.backward()
        """
        if not self.captions:
            raise ValueError(f"{self!r} has no captions, so no training pairs: open it with its captions to train on it.")
        return DataLoader(
            self, batch_size=batch_size, shuffle=shuffle, num_workers=num_workers, collate_fn=collate, **kwargs
        )

    def image_loader(self, batch_size: int, *, num_workers: int = 0, **kwargs: Any) -> DataLoader:
        """A DataLoader over the images, in order, batched by :func:`xmatch.data.collate_images`
        (each image once: for evaluation and offline encoding).

        Example:
            >>> for b in ds.image_loader(64, num_workers=4):  # needs a dataset and a model  # doctest: +SKIP
            ...     embs = model.encode_images(b.images)
        """
        return DataLoader(
            self.images, batch_size=batch_size, shuffle=False, num_workers=num_workers,
            collate_fn=collate_images, **kwargs,
        )

    def image_batches(self, batch_size: int) -> Iterator[ImageBatch]:
        """Image batches in order (the interface :func:`xmatch.eval.evaluate` reads)."""
        return iter(self.image_loader(batch_size))

    def __repr__(self) -> str:
        per = f", {self.captions_per_image} per image" if self.captions_per_image else ""
        return (
            f"{type(self).__name__}(root={str(self.root)!r}, split={self.split!r}: "
            f"{self.num_images} images, {len(self.captions)} captions{per})"
        )


class ImageView(Dataset[ImageItem]):
    """Map-style view of a dataset's images: ``view[i]`` is an :class:`ImageItem`."""

    def __init__(self, dataset: ImageTextDataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return self.dataset.num_images

    def __getitem__(self, index: int) -> ImageItem:
        i = check_index(index, self.dataset.num_images, "image")
        return ImageItem(self.dataset.image(i), i)


def check_index(index: int, size: int, what: str) -> int:
    """``index`` as a non-negative index (negative ones count from the end) or an IndexError."""
    i = operator.index(index)
    if i < 0:
        i += size
    if not 0 <= i < size:
        raise IndexError(f"{what} index {index} is out of range for {size} {what}s.")
    return i
