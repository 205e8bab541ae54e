"""Evaluate models on a dataset: encode each image and caption once, score in bounded memory,
rank with the papers' protocol.

The pipeline is disentangled as in TERN/TERAN: images and captions are encoded separately
(each image once, not once per caption as the original ``encode_data`` does), then only the
score blocks the protocol needs are computed (the 5 diagonal 1K blocks for COCO 1K, the whole
matrix for 5K), chunked through the model's pooler. Several models form an ensemble by
averaging their score blocks (TERAN's ensemble).

:func:`evaluate` never holds every image's or every caption's embeddings while it scores:
:func:`score_dataset` writes them to temporary files as they are encoded and reads back one
caption bucket and one step of images at a time, with the same scores bit for bit as
:func:`encode_dataset` followed by :func:`score_blocks`. At COCO-5K size that is 0.69 GiB of
images (5,000 x 36 regions x 1,024 float32) and about 1 GiB of captions less at the peak.
"""

from __future__ import annotations

import contextlib
import functools
import os
import tempfile
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

from xmatch.model.buckets import BucketedEmbeddings, plan_buckets, slice_bucket, token_spans
from xmatch.model.embeddings import Embeddings
from xmatch.data.base import ImageTextDataset
from xmatch.data.fit import check_images_fit
from xmatch.eval.protocol import EvalResult, evaluate_blocks, fold_layout
from xmatch.model.inputs import ImageBatch
from xmatch.core.memory import release_free_memory
from xmatch.model.model import MatchingModel
from xmatch.core.progress import progress_bar


class RetrievalSet(Protocol):
    """What evaluation reads from a dataset (every dataset of :mod:`xmatch.data` provides it).

    ``captions`` are ordered image by image, ``captions_per_image`` of each;
    ``image_batches(batch_size)`` yields, in image order, :class:`~xmatch.model.inputs.ImageBatch`
    records (:func:`xmatch.data.collate_images` makes them).
    """

    captions: Sequence[str]
    captions_per_image: int

    def image_batches(self, batch_size: int) -> Iterator[ImageBatch]: ...


@dataclass
class Encoded:
    """A dataset encoded by one model: image and caption embeddings in length buckets
    (:class:`~xmatch.model.buckets.BucketedEmbeddings`), indexed in dataset order."""

    images: BucketedEmbeddings
    captions: BucketedEmbeddings
    seconds: float


@torch.inference_mode()
def encode_dataset(
    model: MatchingModel,
    dataset: RetrievalSet,
    *,
    image_batch_size: int = 64,
    text_batch_size: int = 256,
    progress: bool = True,
) -> Encoded:
    """Encode every image once and every caption once, into length buckets: captions are
    encoded shortest first (so a batch pads only to its own longest), and neither side is
    ever padded to the corpus's longest item.

    Example:
        >>> enc = encode_dataset(model, xmatch.data.open_dataset("teran", "data/coco", split="test"))  # needs the COCO features on disk  # doctest: +SKIP
    """
    start = time.perf_counter()
    model.eval()
    parts = []
    n_images = len(dataset.captions) // dataset.captions_per_image
    with progress_bar(total=n_images, desc="encode images", unit="img", show=progress) as bar:
        for batch in dataset.image_batches(image_batch_size):
            parts.append(model.encode_images(batch.images))
            release_free_memory()  # the batch's activations: growing batches never fit old heap holes
            bar.update(len(parts[-1]))
    if not parts:
        raise ValueError("the dataset has no images to encode.")
    images = BucketedEmbeddings.from_parts(parts, consume=True)
    if len(images) != n_images:
        raise ValueError(
            f"the dataset yielded {len(images)} images for {len(dataset.captions)} captions "
            f"({dataset.captions_per_image} per image = {n_images} images expected)."
        )
    captions = encode_captions(model, dataset.captions, batch_size=text_batch_size, progress=progress)
    return Encoded(images, captions, time.perf_counter() - start)


@torch.inference_mode()
def encode_captions(
    model: MatchingModel, captions: Sequence[str], *, batch_size: int = 256, progress: bool = True
) -> BucketedEmbeddings:
    """Encode captions in batches of similar length (sorted by length, so a batch pads only to
    its own longest) into length buckets, in corpus order; what :func:`encode_dataset` and
    :func:`score_dataset` hold.

    Example:
        >>> txt = encode_captions(model, ["a dog", "a red bus on the street"], progress=False)  # needs a model  # doctest: +SKIP
    """
    model.eval()
    texts = list(captions)
    if not texts:
        raise ValueError("the dataset has no captions to encode.")
    batches = _caption_batches(texts, batch_size)
    parts: list[Embeddings | None] = [None] * len(batches)
    # longest batch first: the text encoder's largest activations (a batch of run-on captions:
    # 0.2 GiB for BERT-base) come while few captions are held, not beside all the others.
    # The batches and their order in the buckets stay those of the shortest-first loop.
    for b in progress_bar(reversed(range(len(batches))), total=len(batches), desc="encode captions", unit="batch",
                          show=progress):
        parts[b] = model.encode_texts([texts[k] for k in batches[b]], batch_size=batch_size)
        release_free_memory()
    positions = [torch.tensor(chosen, dtype=torch.long) for chosen in batches]
    return BucketedEmbeddings.from_parts(parts, positions, consume=True)


def _caption_batches(texts: Sequence[str], batch_size: int) -> list[list[int]]:
    """The captions' indices in batches of similar length, shortest first; characters are a
    cheap proxy of the token count (the buckets use the real counts)."""
    order = sorted(range(len(texts)), key=lambda k: len(texts[k]))
    return [order[i : i + batch_size] for i in range(0, len(texts), batch_size)]


#: what :func:`score_blocks` scores: a fold (a slice of images against their own captions), or
#: chosen ``(image indices, caption indices)`` (e.g. the members and captions of hard-negative groups)
Block = slice | tuple[np.ndarray, np.ndarray]


@torch.inference_mode()
def score_blocks(
    model: MatchingModel,
    encoded: Encoded,
    folds: Sequence[Block],
    captions_per_image: int,
    *,
    rows_per_step: int = 256,
    progress: bool = True,
) -> list[np.ndarray]:
    """The score block of each fold (its images against its own captions), or of each chosen
    ``(images, captions)`` pair of index arrays (``[len(images), len(captions)]``), float32 on CPU.

    Rows are scored ``rows_per_step`` images at a time through ``model.similarity``, which
    chunks further so peak memory stays bounded whatever the set size.
    """
    c = captions_per_image
    blocks = []
    total = sum(f.stop - f.start if isinstance(f, slice) else len(f[0]) for f in folds)
    with progress_bar(total=total, desc="similarity", unit="img", show=progress) as bar:
        for fold in folds:
            if not isinstance(fold, slice):
                rows, cols = fold
                scores = model.similarity(_take(encoded.images, rows), _take(encoded.captions, cols))
                blocks.append(scores.float().cpu().numpy())
                bar.update(len(rows))
                continue
            txt = encoded.captions[c * fold.start : c * fold.stop]
            block = np.empty((fold.stop - fold.start, len(txt)), dtype=np.float32)
            for i in range(fold.start, fold.stop, rows_per_step):
                j = min(i + rows_per_step, fold.stop)
                block[i - fold.start : j - fold.start] = model.similarity(encoded.images[i:j], txt).float().cpu().numpy()
                bar.update(j - i)
            blocks.append(block)
    return blocks


@torch.inference_mode()
def score_dataset(
    model: MatchingModel,
    dataset: RetrievalSet,
    folds: Sequence[slice],
    captions_per_image: int,
    *,
    image_batch_size: int = 64,
    text_batch_size: int = 256,
    rows_per_step: int = 256,
    progress: bool = True,
) -> tuple[list[np.ndarray], float, float]:
    """The score block of each fold, as ``score_blocks(model, encode_dataset(model, dataset),
    folds, ...)`` computes it, without holding every image's embeddings while scoring.

    The images are encoded first, in the batches :func:`encode_dataset` encodes them, and each
    batch is written to a temporary file (``tempfile``'s, in ``TMPDIR``, unlinked from the
    start; on a tmpfs it stays in memory, outside the process) instead of being kept; then the
    captions are encoded in :func:`encode_captions`'s batches and put in its buckets, each
    bucket written to a second temporary file; then, one caption bucket at a time, each step of
    ``rows_per_step`` images is read back, scored against the bucket's captions of its fold and
    dropped. So scoring holds the scores, one bucket of captions and one step of images, never
    every caption (1.2 GiB at COCO-5K size), and neither encoder runs while the scores are held.

    The batches, the steps and the captions' buckets are those of the two-stage path, so the
    scores are the same bit for bit when every image has the same number of regions
    (bottom-up top-36 features, grids), and for poolers that take the max over regions (MrSw,
    MrAvgw) whatever the lengths. With images of different lengths a step's images are bucketed
    among themselves rather than among the whole set, and poolers that sum over regions (MwSr,
    Symm) may then differ in the last bits (up to 2e-6, as between two chunk sizes).

    Args:
        folds: image ranges in increasing order, not overlapping (what
            :func:`~xmatch.eval.protocol.fold_layout` gives).

    Returns:
        The blocks (``[images, captions_per_image x images]`` each, float32), and the seconds
        spent encoding and scoring.

    Example:
        >>> blocks, encode_s, similarity_s = score_dataset(model, dataset, fold_layout(5000, "coco-5k"), 5)  # needs a model and a dataset  # doctest: +SKIP
    """
    if not _ranges_in_order(folds):
        raise ValueError(
            f"score_dataset scores non-empty image ranges in increasing order, without overlaps; got {list(folds)}. "
            "Score chosen pairs, or ranges in another order, with encode_dataset and score_blocks."
        )
    c = captions_per_image
    n_images = len(dataset.captions) // c
    if folds and folds[-1].stop > n_images:
        raise ValueError(f"a fold ends at image {folds[-1].stop}, but the dataset has {n_images} images.")
    start = time.perf_counter()
    model.eval()
    images = _encode_images_to(model, dataset, image_batch_size, progress)
    with contextlib.closing(images):
        if len(images) != n_images:
            raise ValueError(
                f"the dataset yielded {len(images)} images for {len(dataset.captions)} captions "
                f"({c} per image = {n_images} images expected)."
            )
        captions = _SpilledCaptions.encode(model, dataset.captions, text_batch_size, progress)
        with contextlib.closing(captions):
            encode_s = time.perf_counter() - start
            start = time.perf_counter()
            blocks = _score_spilled(model, images, captions, folds, c, rows_per_step, progress)
    return blocks, encode_s, time.perf_counter() - start


def _score_spilled(
    model: MatchingModel,
    images: _SpilledImages,
    captions: _SpilledCaptions,
    folds: Sequence[slice],
    c: int,
    rows_per_step: int,
    progress: bool,
) -> list[np.ndarray]:
    """Each fold's block, one caption bucket at a time: the bucket read back, each step of the
    fold's images read back and scored against the bucket's captions of that fold. The pooler
    scores bucket against bucket whichever way the buckets arrive, so these are the blocks of
    ``score_blocks`` on the same buckets, bit for bit."""
    blocks = [np.empty((f.stop - f.start, c * (f.stop - f.start)), dtype=np.float32) for f in folds]
    pairs = sum(c * (f.stop - f.start) ** 2 for f in folds)
    with progress_bar(total=pairs, desc="similarity", unit="pair", show=progress) as bar:
        for k in range(len(captions)):
            _score_bucket(model, images, captions, k, folds, blocks, c, rows_per_step, bar)
            release_free_memory()  # the bucket's pages, before the next one is read
    return blocks


def _score_bucket(
    model: MatchingModel,
    images: _SpilledImages,
    captions: _SpilledCaptions,
    k: int,
    folds: Sequence[slice],
    blocks: list[np.ndarray],
    c: int,
    rows_per_step: int,
    bar: Any,
) -> None:
    """Caption bucket ``k`` scored against each fold's images, into ``blocks``; its own
    function, so that no view of the bucket outlives it while the next one is read."""
    bucket, positions = captions.bucket(k, model.device)
    for f, block in zip(folds, blocks):
        piece = slice_bucket(bucket, positions, c * f.start, c * f.stop)
        if piece is None:
            continue
        txt, columns = piece[0], piece[1].numpy()
        for i in range(f.start, f.stop, rows_per_step):
            j = min(i + rows_per_step, f.stop)
            step = images.read(i, j, model.device)
            block[i - f.start : j - f.start, columns] = model.similarity(step, txt).float().cpu().numpy()
            del step
            bar.update((j - i) * len(columns))


class _SpillFile:
    """Embeddings kept in one temporary file instead of memory. The file is unlinked when it is
    made (``tempfile.TemporaryFile``), so nothing is left behind, even by a killed process; it
    lives in ``TMPDIR`` (on a tmpfs it stays in memory, outside the process)."""

    FIELDS = ("tokens", "mask", "pooled", "boxes")

    def __init__(self, prefix: str) -> None:
        self.file = tempfile.TemporaryFile(prefix=prefix)
        # per entry, per field: (offset, dtype, shape), or None for a field the entry lacks
        self.entries: list[dict[str, tuple[int, torch.dtype, torch.Size] | None]] = []

    def add(self, e: Embeddings) -> int:
        """Write ``e``; returns its entry number."""
        fields: dict[str, tuple[int, torch.dtype, torch.Size] | None] = {}
        for name in self.FIELDS:
            t = getattr(e, name)
            if t is None:
                fields[name] = None
                continue
            t = t.detach().contiguous().cpu()
            fields[name] = (self.file.seek(0, os.SEEK_END), t.dtype, t.shape)
            self.file.write(t.reshape(-1).view(torch.uint8).numpy().data)  # raw bytes: any dtype, bf16 too
        self.entries.append(fields)
        return len(self.entries) - 1

    def get(self, k: int, device: torch.device | str = "cpu") -> Embeddings:
        """Entry ``k``, read back."""
        tensors = {}
        for name, where in self.entries[k].items():
            if where is None:
                tensors[name] = None
                continue
            offset, dtype, shape = where
            raw = torch.empty(shape.numel() * dtype.itemsize, dtype=torch.uint8)
            self.file.seek(offset)
            self.file.readinto(raw.numpy().data)
            tensors[name] = raw.view(dtype).reshape(shape).to(device)
        return Embeddings(**tensors)

    def close(self) -> None:
        self.file.close()


class _SpilledImages:
    """Encoded image batches kept in a temporary file (:class:`_SpillFile`), read back a step at
    a time."""

    def __init__(self) -> None:
        self.spill = _SpillFile("xmatch-eval-images-")
        self.ranges: list[tuple[int, int]] = []  # per batch: first image, one past the last

    def __len__(self) -> int:
        return self.ranges[-1][1] if self.ranges else 0

    def add(self, e: Embeddings) -> None:
        self.spill.add(e)
        self.ranges.append((len(self), len(self) + len(e)))

    def read(self, start: int, stop: int, device: torch.device) -> BucketedEmbeddings:
        """Images ``start .. stop - 1``, bucketed (one bucket when they all have the same length:
        ``encode_dataset``'s buckets sliced there)."""
        pieces = [self.spill.get(k, device)[max(start - first, 0) : stop - first]
                  for k, (first, end) in enumerate(self.ranges) if first < stop and end > start]
        return BucketedEmbeddings.from_parts(pieces, consume=True)

    def close(self) -> None:
        self.spill.close()


class _SpilledCaptions:
    """The caption buckets :func:`encode_captions` makes, kept in a temporary file and read back
    one at a time: the same batches, encoded longest first, each written to a file as soon as
    it is encoded; then each bucket filled from them (:func:`~xmatch.model.buckets.plan_buckets`)
    and written to a second file, the first closed. At COCO-5K size this keeps one bucket (at
    most a few hundred MB) in memory instead of every caption (1.2 GiB)."""

    def __init__(self, buckets: _SpillFile, positions: list[torch.Tensor]) -> None:
        self.buckets, self.positions = buckets, positions

    @classmethod
    @torch.inference_mode()
    def encode(cls, model: MatchingModel, captions: Sequence[str], batch_size: int, progress: bool) -> _SpilledCaptions:
        """The captions encoded in :func:`encode_captions`'s batches, longest first, and bucketed."""
        texts = list(captions)
        if not texts:
            raise ValueError("the dataset has no captions to encode.")
        batches = _caption_batches(texts, batch_size)

        def encoded() -> Iterator[tuple[int, Embeddings]]:
            for b in progress_bar(reversed(range(len(batches))), total=len(batches), desc="encode captions",
                                  unit="batch", show=progress):
                yield b, model.encode_texts([texts[k] for k in batches[b]], batch_size=batch_size)

        return cls.from_batches(encoded(), [torch.tensor(chosen, dtype=torch.long) for chosen in batches])

    @classmethod
    def from_batches(cls, batches: Iterable[tuple[int, Embeddings]], positions: Sequence[torch.Tensor]) -> _SpilledCaptions:
        """Bucket encoded batches ``(b, embeddings)`` (in any order; batch ``b`` holds the
        captions at corpus ``positions[b]``) as ``BucketedEmbeddings.from_parts`` would, each
        batch written to a file as it arrives and each bucket as it is filled."""
        spans: list[torch.Tensor | None] = [None] * len(positions)
        entry: dict[int, int] = {}
        encoded = _SpillFile("xmatch-eval-caption-batches-")
        buckets = _SpillFile("xmatch-eval-captions-")
        try:
            for b, e in batches:
                spans[b] = token_spans(e.mask).cpu()
                entry[b] = encoded.add(e)
                del e
                release_free_memory()
            if any(s is None for s in spans):
                raise ValueError(f"{sum(s is None for s in spans)} of {len(spans)} caption batches never arrived.")
            plans = plan_buckets(spans, positions)
            for plan in plans:
                read = functools.lru_cache(maxsize=2)(lambda b: encoded.get(entry[b]))  # a batch feeds one or two buckets in a row
                buckets.add(plan.fill(read))
                del read
                release_free_memory()
        except BaseException:
            buckets.close()
            raise
        finally:
            encoded.close()
        return cls(buckets, [plan.positions for plan in plans])

    def __len__(self) -> int:
        return len(self.positions)

    def bucket(self, k: int, device: torch.device) -> tuple[Embeddings, torch.Tensor]:
        """Bucket ``k`` and its items' corpus positions."""
        return self.buckets.get(k, device), self.positions[k]

    def close(self) -> None:
        self.buckets.close()


def _encode_images_to(model: MatchingModel, dataset: RetrievalSet, batch_size: int, progress: bool) -> _SpilledImages:
    """Encode the dataset's images batch by batch as :func:`encode_dataset` does, each batch
    written to a temporary file as soon as it is encoded."""
    spilled = _SpilledImages()
    n_images = len(dataset.captions) // dataset.captions_per_image
    try:
        with progress_bar(total=n_images, desc="encode images", unit="img", show=progress) as bar:
            for batch in dataset.image_batches(batch_size):
                encoded = model.encode_images(batch.images)
                spilled.add(encoded)
                bar.update(len(encoded))
                del encoded
                release_free_memory()  # the batch's activations: growing batches never fit old heap holes
    except BaseException:
        spilled.close()
        raise
    if not len(spilled):
        spilled.close()
        raise ValueError("the dataset has no images to encode.")
    return spilled


def _ranges_in_order(folds: Sequence[Block]) -> bool:
    """Whether ``folds`` are non-empty image ranges in increasing order, without overlaps."""
    ranges = all(isinstance(f, slice) and f.step in (None, 1) and f.start < f.stop for f in folds)
    return ranges and all(a.stop <= b.start for a, b in zip(folds, folds[1:]))


def _take(items: BucketedEmbeddings, index: np.ndarray) -> BucketedEmbeddings | Embeddings:
    """The items at ``index``, in that order: a view for a run of neighbours (a group's members
    usually are), else the items gathered one by one."""
    index = np.asarray(index, dtype=np.int64)
    if len(index) and (np.diff(index) == 1).all():
        return items[int(index[0]) : int(index[-1]) + 1]
    return Embeddings.cat([items[int(k)] for k in index])


def evaluate(
    models: MatchingModel | Sequence[MatchingModel],
    dataset: RetrievalSet,
    protocol: str = "full",
    *,
    relevance: Mapping[str, np.ndarray] | None = None,
    fold_images: int | None = None,
    image_batch_size: int = 64,
    text_batch_size: int = 256,
    progress: bool = True,
) -> EvalResult:
    """Evaluate one model, or an ensemble (average of the models' scores), on a dataset.

    Args:
        models: a model or several (ensemble: their score matrices are averaged).
        dataset: images and their captions (see :class:`RetrievalSet`).
        protocol: ``coco-1k``, ``coco-5k``, ``f30k-1k`` or ``full``.
        relevance: ``{name: [captions, images]}`` for NDCG@25 (see
            :mod:`xmatch.eval.relevance`).
        fold_images: images per fold (default: the protocol's).

    Example:
        >>> result = xmatch.eval.evaluate(model, dataset, "coco-1k")  # needs a model and a dataset  # doctest: +SKIP
        >>> print(result.table())  # doctest: +SKIP
    """
    models = [models] if isinstance(models, MatchingModel) else list(models)
    if not models:
        raise ValueError("evaluate needs at least one model.")
    if isinstance(dataset, ImageTextDataset):
        for model in models:
            check_images_fit(model, dataset, "evaluation")
    c = dataset.captions_per_image
    if not c:
        raise ValueError(
            "the papers' protocol needs the same number of captions for every image (5 for COCO "
            "and Flickr30k); this dataset's images have different counts."
        )
    n_images = len(dataset.captions) // c
    if n_images * c != len(dataset.captions):
        raise ValueError(f"{len(dataset.captions)} captions are not {c} per image.")
    folds = fold_layout(n_images, protocol, fold_images)
    blocks, timings, _ = ensemble_blocks(
        models, dataset, folds, c, image_batch_size=image_batch_size, text_batch_size=text_batch_size, progress=progress
    )
    result = evaluate_blocks(blocks, protocol, c, relevance)
    result.timings = timings
    return result


def ensemble_blocks(
    models: Sequence[MatchingModel],
    dataset: RetrievalSet,
    folds: Sequence[Block],
    captions_per_image: int,
    *,
    image_batch_size: int = 64,
    text_batch_size: int = 256,
    progress: bool = True,
    keep_images: bool = False,
) -> tuple[list[np.ndarray], dict[str, float], list[BucketedEmbeddings]]:
    """Encode the dataset with each model, score each fold's block and average the blocks over
    the models (one model: its own scores). Each model's embeddings are freed before the next
    is encoded; image ranges in order are scored by :func:`score_dataset`, which never holds
    every image at once.

    Returns:
        The averaged blocks, the timings (``model{k}_encode_s``, ``model{k}_similarity_s``) and,
        with ``keep_images``, each model's image embeddings (else an empty list).
    """
    blocks: list[np.ndarray] | None = None
    timings: dict[str, float] = {}
    images: list[BucketedEmbeddings] = []
    # image ranges in order are scored as their images are encoded (score_dataset); chosen
    # pairs, and images kept for later, need every image's embeddings at once
    streamed = not keep_images and _ranges_in_order(folds)
    for k, model in enumerate(models):
        if streamed:
            scores, encode_s, similarity_s = score_dataset(
                model, dataset, folds, captions_per_image, image_batch_size=image_batch_size,
                text_batch_size=text_batch_size, progress=progress,
            )
            timings[f"model{k}_encode_s"] = encode_s
            timings[f"model{k}_similarity_s"] = similarity_s
        else:
            encoded = encode_dataset(
                model, dataset, image_batch_size=image_batch_size, text_batch_size=text_batch_size, progress=progress
            )
            start = time.perf_counter()
            scores = score_blocks(model, encoded, folds, captions_per_image, progress=progress)
            timings[f"model{k}_encode_s"] = encoded.seconds
            timings[f"model{k}_similarity_s"] = time.perf_counter() - start
            if keep_images:
                images.append(encoded.images)
            del encoded
        if blocks is None:
            blocks = scores
        else:
            for total, block in zip(blocks, scores):
                total += block
    if len(models) > 1:
        for block in blocks:
            block /= len(models)
    return blocks, timings, images
