"""Datasets: images with their captions, in the layouts the field distributes.

Registered in the ``datasets`` registry (entry-point group ``xmatch_datasets`` for plugins):

- ``teran``: TERAN / TERN bottom-up features, ``bu_att/<id>.npz`` + ``bu_box/<id>.npy``
  (:class:`TeranDataset`);
- ``scan-precomp``: SCAN / VSE++ ``<split>_ims.npy`` + ``<split>_caps.txt``
  (:class:`PrecompDataset`);
- ``image-captions``: image files with a CSV / JSONL captions file
  (:class:`ImageCaptionsDataset`);
- ``webdataset``: WebDataset tar shards, ``KEY.jpg`` + ``KEY.txt`` (:class:`WebDataset`).

Every dataset has ``captions`` ordered image by image, ``caption_image``,
``captions_per_image``, ``image(i)``, a pair view for training (``dataset[k]``,
:func:`collate`, ``dataset.loader``) and an image-only view for evaluation
(``dataset.image_loader``, ``dataset.image_batches``).

Example:
    >>> from xmatch.data import open_dataset
    >>> ds = open_dataset("teran", "data/coco", split="train", restval=True)  # needs the COCO features on disk  # doctest: +SKIP
    >>> batch = next(iter(ds.loader(40)))  # doctest: +SKIP
    >>> batch.images.regions.shape, len(batch.texts)  # a PairBatch  # doctest: +SKIP
    (torch.Size([40, 36, 2048]), 40)
"""

from __future__ import annotations

import inspect
import os
import types
import typing
from typing import Any

from xmatch.data.base import ImageTextDataset, ImageView
from xmatch.data.collate import collate, collate_images
from xmatch.data.errors import DataError, DataFileNotFoundError, NoCaptionsError
from xmatch.data.image_captions import ImageCaptionsDataset
from xmatch.data.items import ImageItem, Pair, RegionImage
from xmatch.data.precomp import PrecompDataset
from xmatch.data.teran import TeranDataset
from xmatch.data.webdataset import WebDataset
from xmatch.core.registry import get_registry
from xmatch.core.spec import check_component, instantiate

_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}


def open_dataset(name: str, root: str | os.PathLike, split: str | None = None, **options: Any) -> ImageTextDataset:
    """Open a registered dataset layout by name.

    Options are checked against the layout's signature (unknown ones are rejected, with
    close matches); string values, as the command line passes them, are converted to the
    option's type (``"true"`` -> True, ``"5"`` -> 5, ``"none"`` -> None).

    Args:
        name: a registered dataset (``teran``, ``scan-precomp``, ``image-captions``, or a plugin's).
        root: the dataset folder (or file, for ``image-captions``).
        split: the split to read (default: the layout's own, if it has one).
        **options: the layout's keyword arguments.

    Raises:
        xmatch.core.registry.RegistryError: unknown name.
        xmatch.SpecError: unknown option or a value of the wrong type.

    Example:
        >>> ds = open_dataset("scan-precomp", "data/coco_precomp", split="testall")  # needs the COCO precomp features on disk  # doctest: +SKIP
        >>> ds.num_images, ds.captions_per_image  # doctest: +SKIP
        (5000, 5)
    """
    registry = get_registry("datasets")
    builder = registry.get(name)
    target = builder.__init__ if inspect.isclass(builder) else builder
    try:
        hints = typing.get_type_hints(target)
    except (NameError, TypeError):  # unresolvable annotations (a plugin's): pass strings through
        hints = {}
    table: dict[str, Any] = {"name": name, "root": root}
    if split is not None:
        table["split"] = split
    table.update({k: _from_text(v, hints[k]) if k in hints else v for k, v in options.items()})
    return instantiate(check_component(table, "datasets", f"dataset '{registry.canonical(name)}'"), "datasets")


def _from_text(value: Any, hint: Any) -> Any:
    """A command-line string converted to the option's type when the option takes no string."""
    if not isinstance(value, str):
        return value
    union = typing.get_origin(hint) in (typing.Union, types.UnionType)
    accepted = set(typing.get_args(hint)) if union else {hint}
    if str in accepted or hint is Any:
        return value
    text = value.strip().lower()
    if type(None) in accepted and text in ("none", "null"):
        return None
    if bool in accepted and text in _TRUE | _FALSE:
        return text in _TRUE
    for kind in (int, float):
        if kind in accepted:
            try:
                return kind(value)
            except ValueError:
                pass
    return value  # check_component reports the type mismatch


__all__ = [
    "DataError", "DataFileNotFoundError", "ImageCaptionsDataset", "ImageItem", "ImageTextDataset",
    "ImageView", "NoCaptionsError", "Pair", "PrecompDataset", "RegionImage", "TeranDataset", "WebDataset", "collate", "collate_images",
    "open_dataset",
]
