"""Fill an index from a dataset: encode its images (or captions) batch by batch, commit shards.

Each shard of ``shard_size`` items is one atomic append, so a killed run keeps every shard it
finished; running again with ``resume=True`` (``xmatch index ... --append``) encodes only the
items whose ids are not in the index yet.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Subset

from xmatch.data.collate import collate_images
from xmatch.model.embeddings import Embeddings
from xmatch.index.photos import dataset_pictures
from xmatch.index.search import SearchIndex, check_compute_dtype, encoding
from xmatch.core.progress import progress_bar


def caption_ids(dataset: Any) -> list[str]:
    """``<image name>#<n>``: the n-th caption (from 0) of each image, e.g. ``900#2``."""
    owner = np.asarray(dataset.caption_image)
    first = np.searchsorted(owner, owner, side="left")
    return [f"{dataset.image_names[o]}#{k - f}" for k, (o, f) in enumerate(zip(owner, first))]


def index_dataset(
    index: SearchIndex,
    dataset: Any,
    *,
    batch_size: int = 64,
    shard_size: int = 1024,
    resume: bool = False,
    progress: bool = True,
    compute_dtype: str = "float32",
) -> int:
    """Encode a dataset's images (image index) or captions (caption index) into ``index``.

    Args:
        index: the index to append to (its side decides what is encoded).
        dataset: an :mod:`xmatch.data` dataset: images with captions, or for an image index
            the images alone (e.g. ``open_dataset("teran", "feats", captions_per_image=0)`` of
            pictures extracted without captions; their ids are then the pictures' file names).
        batch_size: images encoded at once (captions: 4x).
        shard_size: items per committed shard.
        resume: skip items whose ids are already in the index (a killed run continued);
            without it such ids are refused.
        progress: show a progress bar.
        compute_dtype: ``"bfloat16"`` encodes under bfloat16 autocast
            (:func:`xmatch.index.search.encoding`).

    An image index records the folder of the dataset's pictures, where one holds the picture
    of every stored item (:func:`xmatch.index.photos.dataset_pictures`; ``xmatch serve``
    shows them from there).

    Returns:
        The number of items added.

    Raises:
        ValueError: a caption index and a dataset without captions, an unknown ``compute_dtype``.

    Example:
        >>> index = xmatch.index.create("idx", model, model_ref="teran-mrsw-scenes")  # encodes the scenes benchmark (minutes)  # doctest: +SKIP
        >>> index_dataset(index, xmatch.scenes.dataset.open_scenes(split="test"))  # doctest: +SKIP
        100
    """
    if shard_size < 1 or batch_size < 1:
        raise ValueError(f"batch_size and shard_size must be positive, got {batch_size} and {shard_size}.")
    check_compute_dtype(compute_dtype)
    if index.side == "texts" and not len(dataset.captions):
        raise ValueError(
            f"{index.root} is a caption index and the dataset has no captions ({dataset!r}); index its images "
            "instead (an image index: xmatch.index.create(..., side='images')), or open it with its captions."
        )
    ids = list(dataset.image_names) if index.side == "images" else caption_ids(dataset)
    present = set(index.ids) if resume else set()
    remaining = [k for k, i in enumerate(ids) if i not in present]
    what = "images" if index.side == "images" else "captions"
    bar = progress_bar(total=len(remaining), desc=f"index {what}", unit=what[:-1], show=progress)
    added = 0
    pending: list[tuple[Embeddings, torch.Tensor | None, list[int]]] = []
    for embeddings, boxes, rows in _encoded(index, dataset, remaining, batch_size, compute_dtype):
        pending.append((embeddings, boxes, rows))
        bar.update(len(rows))
        if sum(len(r) for *_, r in pending) >= shard_size:
            added += _commit(index, pending, ids, dataset)
            pending = []
    if pending:
        added += _commit(index, pending, ids, dataset)
    bar.close()
    if index.side == "images" and index.pictures is None:
        folder = dataset_pictures(dataset, index.ids)
        if folder is not None:
            index.record_pictures(folder)
    return added


def _encoded(index: SearchIndex, dataset: Any, rows_to_encode: list[int], batch_size: int, compute_dtype: str):
    """``(embeddings, boxes or None, item numbers)`` batch by batch."""
    model = index.model
    if index.side == "texts":
        captions = dataset.captions
        step = 4 * batch_size
        for start in range(0, len(rows_to_encode), step):
            rows = rows_to_encode[start : start + step]
            with encoding(model, compute_dtype):
                e = model.encode_texts([captions[k] for k in rows], batch_size=step).to(torch.float32)
            yield e, None, rows
        return
    loader = DataLoader(Subset(dataset.images, rows_to_encode), batch_size=batch_size, shuffle=False, collate_fn=collate_images)
    for batch in loader:
        rows = batch.image_ids.tolist()
        with encoding(model, compute_dtype):
            e = model.encode_images(batch.images).to(torch.float32)
        yield e, index._stored_boxes(batch.images, e), rows


def _commit(index: SearchIndex, pending: list, ids: list[str], dataset: Any) -> int:
    embeddings = Embeddings.cat([e for e, _, _ in pending])
    rows = [r for *_, batch_rows in pending for r in batch_rows]
    boxes = None
    if all(b is not None for _, b, _ in pending):
        width = embeddings.tokens.shape[1]
        boxes = torch.cat([torch.nn.functional.pad(b, (0, 0, 0, width - b.shape[1])) for _, b, _ in pending])
    texts = [dataset.captions[k] for k in rows] if index.side == "texts" else None
    return index._append(embeddings, [ids[k] for k in rows], boxes=boxes, texts=texts)


def copy_index(source: SearchIndex, target: SearchIndex, *, progress: bool = True) -> int:
    """Copy every stored item of ``source`` into ``target`` without encoding again (e.g. an
    embedded index into a Qdrant collection). Both must be of the same model and side.

    Returns:
        The number of items copied.

    Example:
        >>> src = xmatch.index.open("idx")  # needs an index and a Qdrant server  # doctest: +SKIP
        >>> copy_index(src, xmatch.index.create("idx-qdrant", src.model, engine="qdrant", qdrant="http://db:6333"))  # doctest: +SKIP
    """
    if source.fingerprint != target.fingerprint or source.side != target.side:
        raise ValueError(f"{source.root} and {target.root} hold different models or sides; they cannot be copied.")
    copied = 0
    bar = progress_bar(total=len(source), desc="copy index", unit="item", show=progress)
    for start, block in source.store.blocks():
        rows = list(range(start, start + len(block)))
        texts = source.store.texts(rows) if source.side == "texts" else None
        copied += target._append(block, source.store.ids_of(rows), boxes=source.store.boxes(torch.tensor(rows)), texts=texts)
        bar.update(len(rows))
    bar.close()
    return copied
