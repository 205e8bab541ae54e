"""A chunk of an extraction run: the unit that is decoded, computed, written and resumed, by
every engine (one process, ``torchrun``, a Ray actor): :class:`ChunkSet` decodes a chunk's
pictures, :func:`run_chunk` computes and writes its regions, then its record in
``OUT/.extract/`` (the chunk is then finished)."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from xmatch.extract.captions import ImageRecord
from xmatch.extract.writers import RegionFiles, write_json_atomic
from xmatch.io.pictures import ImageTooLargeError
from xmatch.regions.images import UnreadableImageError, picture_size
from xmatch.regions.pipeline import PictureLoader, Prepared, RegionPipeline

logger = logging.getLogger(__name__)

#: the run's own folder inside the output folder (chunk records, the precomp parts)
STATE = ".extract"

Loaded = list[tuple[ImageRecord, Prepared | str]]


class ChunkSet(torch.utils.data.Dataset):
    """Chunk ``k`` of the work -> ``(k, parts, first part decoded)``, decoded in workers; the
    other parts (a chunk over the batch budget) are decoded by :meth:`load_part` in turn."""

    def __init__(self, chunks: list[list[ImageRecord]], pending: list[int], load: PictureLoader, max_batch_pixels: int) -> None:
        self.chunks, self.pending, self.load, self.max_batch_pixels = chunks, pending, load, max_batch_pixels

    def __len__(self) -> int:
        return len(self.pending)

    def __getitem__(self, i: int) -> tuple[int, list[list[ImageRecord]], Loaded]:
        return self.chunk(self.pending[i])

    def chunk(self, k: int) -> tuple[int, list[list[ImageRecord]], Loaded]:
        """Chunk ``k``: ``(k, parts, first part decoded)``."""
        parts = self.parts(self.chunks[k])
        return k, parts, self.load_part(parts[0])

    def parts(self, chunk: list[ImageRecord]) -> list[list[ImageRecord]]:
        """The chunk cut where the pictures it keeps would pass the batch budget (sizes from the
        headers; only a loader that keeps pictures holds more than one at a time)."""
        if not self.load.keep_picture:
            return [chunk]
        parts: list[list[ImageRecord]] = [[]]
        held = 0
        for record in chunk:
            size = picture_size(record.path)
            pixels = size[0] * size[1] if size is not None and size[0] * size[1] <= self.load.max_pixels else 0
            if parts[-1] and held + pixels > self.max_batch_pixels:
                parts.append([])
                held = 0
            parts[-1].append(record)
            held += pixels
        return parts

    def load_part(self, records: list[ImageRecord]) -> Loaded:
        """``(record, Prepared or the reason it is left out)`` of each record."""
        items: Loaded = []
        for record in records:
            try:
                items.append((record, self.load(record.path, record.name)))
            except (UnreadableImageError, ImageTooLargeError, FileNotFoundError) as exc:
                items.append((record, str(exc)))
        return items


def run_chunk(
    pipe: RegionPipeline, chunk_set: ChunkSet, files: RegionFiles, out: Path, k: int,
    parts: list[list[ImageRecord]], first: Loaded, part_done: Callable[[int], Any] | None = None,
) -> int:
    """Compute chunk ``k`` (cut into ``parts``, the first decoded as ``first``), write its
    region files, then its record (the chunk is then finished); the images it extracted. Every
    engine runs a chunk through here: one process, ``torchrun``, a Ray actor."""
    sizes: dict[str, list[int]] = {}
    bad: list[tuple[str, str]] = []
    for j, part in enumerate(parts):
        part_sizes, part_bad = _run_part(pipe, files, first if j == 0 else chunk_set.load_part(part))
        first = None  # a part's pictures go once it has run, before the next is decoded
        sizes.update(part_sizes)
        bad += part_bad
        if part_done is not None:
            part_done(len(part))
    write_json_atomic(chunk_file(out, k), {"sizes": sizes, "unreadable": bad})
    return len(sizes)


def _run_part(pipe: RegionPipeline, files: RegionFiles, items: Loaded) -> tuple[dict[str, list[int]], list[tuple[str, str]]]:
    """Regions of the decoded pictures of ``items`` written; ``(sizes, images left out)``."""
    good = [(r, p) for r, p in items if isinstance(p, Prepared)]
    bad = [(r.name, p) for r, p in items if isinstance(p, str)]
    for _, reason in bad:
        logger.warning("skipping image: %s", reason)
    regions = pipe([p for _, p in good]) if good else []
    for (record, _), reg in zip(good, regions, strict=True):
        if not files.done(record.key):
            files.write(record.key, reg.features.numpy(), reg.boxes.numpy())
    return {r.key: [p.width, p.height] for r, p in good}, bad


def chunk_file(out: Path, k: int) -> Path:
    """Where the record of chunk ``k`` of the run in ``out`` is written."""
    return out / STATE / f"chunk-{k:07d}.json"


def read_chunk(out: Path, k: int) -> dict[str, Any]:
    """The record of finished chunk ``k``: ``sizes`` (key -> width, height), ``unreadable``."""
    return json.loads(chunk_file(out, k).read_text(encoding="utf-8"))
