"""The extraction run: a folder of images -> region features in the teran or precomp layout.

Work is cut into fixed chunks of ``batch_size`` images (in id order); a chunk is the unit that
is computed, written and resumed. Its images run through the backbone together, so a resumed
or re-split run gives the same bytes. After a chunk's region files are in place, a small
record of it (image sizes, images left out) is written into ``OUT/.extract/``; a chunk with a
record is finished. Under ``torchrun`` every process takes every N-th chunk; the first one
then writes the dataset files and the manifest from the chunk records. With ``ray`` the
chunks are computed by a Ray cluster's actors instead (:mod:`xmatch.extract.ray_run`), and this
process writes the dataset files and the manifest.

In the teran layout the dataset file (``dataset_xmatch.json``) is written as soon as a split
is finished (every chunk holding one of its images has its record), with the finished splits'
images only, named under ``finished_splits`` (the others under ``pending_splits``), so that
training can start on them; the run's end writes it whole, as a run that was never read
midway would.

Decoded pixels are budgeted: a picture whose header declares more than ``max_pixels`` is not
decoded but left out and listed, as an unreadable one is. A proposer that looks at pixels (a
detector) keeps the whole pictures of a chunk; when they would hold more than
``max_batch_pixels``, the chunk runs in parts, cut by the sizes in the headers (so the same
parts, and the same bytes, on every run), the later parts decoded as their turn comes.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from xmatch.core.errors import XmatchError
from xmatch.extract.captions import ImageRecord, read_records
from xmatch.extract.chunks import STATE, ChunkSet, chunk_file, read_chunk, run_chunk
from xmatch.io.pictures import MAX_BATCH_PIXELS, MAX_PIXELS
from xmatch.regions.manifest import FORMAT, MANIFEST, ManifestError, canonical_pipeline, read_manifest, settings_differences
from xmatch.regions.pipeline import RegionPipeline
from xmatch.extract.writers import (
    DATASET_FILE,
    LAYOUTS,
    PRECOMP_PREFIX,
    RegionFiles,
    check_precomp,
    karpathy_document,
    write_json_atomic,
    write_precomp,
    write_teran,
)

logger = logging.getLogger(__name__)

DTYPES = ("float32", "float16")
#: the settings that decide the bytes written; a resumed run must use the same
COMPARED = ("layout", "dtype", "batch_size", "pipeline", "images", "pixels")


class ExtractError(XmatchError, ValueError):
    """An extraction that cannot start or finish (the message says why and what to do)."""


@dataclass
class ExtractResult:
    """What a run did.

    Attributes:
        out: the output folder.
        layout: ``teran`` or ``precomp``.
        images: images in the written dataset (readable ones).
        extracted: images this process computed in this run.
        skipped: images already finished (``resume``).
        unreadable: ``(image, reason)`` of the files left out: not decodable, or over the
            pixel budget (``max_pixels``).
        feature_dim: width of the region features.
        seconds: wall time of this run, models built (what grows with the number of images).
        captions: where the captions came from.
        splits: images per split.
        captions_per_image: the distinct caption counts of the images (``[5]`` for COCO).
    """

    out: Path
    layout: str
    images: int
    extracted: int
    skipped: int
    unreadable: list[tuple[str, str]]
    feature_dim: int
    seconds: float
    captions: str
    splits: dict[str, int] = field(default_factory=dict)
    captions_per_image: list[int] = field(default_factory=list)

    def summary(self) -> str:
        rate = f", {self.extracted / self.seconds:.1f} images/s" if self.extracted and self.seconds > 0 else ""
        bad = f"; {len(self.unreadable)} left out (unreadable or too large)" if self.unreadable else ""
        splits = ", ".join(f"{k} {v}" for k, v in self.splits.items())
        return (
            f"{self.images} images ({splits}) in {self.out} ({self.layout} layout, {self.feature_dim}-d features): "
            f"{self.extracted} extracted, {self.skipped} already done in {self.seconds:.1f} s{rate}{bad}"
        )


def extract(
    images: str | os.PathLike,
    out: str | os.PathLike,
    pipeline: RegionPipeline | Mapping[str, Any] | None = None,
    *,
    layout: str = "teran",
    captions: str | os.PathLike | None = None,
    split: str = "test",
    dtype: str = "float32",
    batch_size: int = 8,
    workers: int | None = None,
    device: str | torch.device | None = None,
    resume: bool = False,
    overwrite: bool = False,
    progress: bool = True,
    progress_every: float | None = None,
    allow_outside_root: bool = False,
    max_pixels: int = MAX_PIXELS,
    max_batch_pixels: int = MAX_BATCH_PIXELS,
    ray: str | None = None,
    ray_workers: int | None = None,
) -> ExtractResult:
    """Extract region features of every image of a folder into ``out``.

    Args:
        images: the image folder.
        out: the output folder (created).
        pipeline: a :class:`RegionPipeline` or its settings table ``{"proposer": ..., "roi":
            {...}}`` (:meth:`RegionPipeline.from_table`; a table's missing settings take
            :class:`~xmatch.regions.config.RoIConfig`'s defaults). None: the defaults, as
            ``xmatch extract``'s: ``windows`` proposals, 36 per image, EfficientNet-Lite0 with
            its packaged ImageNet weights, the picture's shorter side at 600 px on a stride-16
            map.
        layout: ``teran`` (``bu_att`` / ``bu_box`` + ``dataset_xmatch.json``, read by the
            ``teran`` dataset) or ``precomp`` (``<split>_ims.npy`` ..., read by ``scan-precomp``).
        captions: a captions file (Karpathy / COCO JSON, CSV, JSONL); default: found in the
            image folder, or none (see :mod:`xmatch.extract.captions`).
        split: the split of images whose captions name none.
        dtype: ``float32`` or ``float16`` features on disk.
        batch_size: images per backbone run (and per resumable chunk).
        workers: DataLoader worker processes decoding and resizing images (0: in this one;
            None: :func:`decoding_workers`, none on a machine of two cores or fewer, else 2).
        device: ``cpu``, ``cuda``... (default: CUDA when available; under ``torchrun``,
            ``cuda:LOCAL_RANK``).
        resume: continue the run in ``out`` (finished chunks are skipped; the settings must
            be the same).
        overwrite: remove a previous extraction's files in ``out`` first.
        progress: show a progress bar on a terminal; elsewhere (a log) a plain line every
            ``progress_every`` seconds (:func:`xmatch.core.progress.progress_bar`).
        progress_every: seconds between two progress lines in a log (0: one per chunk);
            None: ``XMATCH_PROGRESS_EVERY`` from the environment, else 60.
        allow_outside_root: read images that the captions file places outside ``images``
            (absolute paths, ``..``, symbolic links out of the folder); off, such an entry is
            refused, naming it.
        max_pixels: the largest picture decoded (width x height, read from the header first;
            default 50 megapixels, :data:`xmatch.io.pictures.MAX_PIXELS`); a larger one is
            left out and listed in ``unreadable``.
        max_batch_pixels: the decoded pixels a chunk keeps at once for a proposer that looks at
            pixels (default 100 megapixels); a chunk over it runs in parts. A single picture
            within ``max_pixels`` always runs, alone if need be.
        ray: compute the chunks on a Ray cluster (``xmatch extract --ray [ADDRESS]``; needs
            ``pip install 'xmatch-zoo[ray]'``): ``"local"`` starts (or joins) a local one, any
            other value is the address of one (``auto``, ``HOST:6379``); a cluster this process
            joined already is used as it is. The files are the same bytes as one process
            writes; a worker that dies has its chunk redone, a killed run continues with
            ``resume``. None: this process (or ``torchrun``'s).
        ray_workers: Ray actors, each holding the pipeline once (default: one per CPU of the
            cluster); the cluster's CPUs are divided among them as torch threads.

    Returns:
        An :class:`ExtractResult` (on every process; the dataset files exist when it returns
        on the first one).

    Raises:
        FileNotFoundError: no images, a missing captions file or image.
        ExtractError: ``out`` holds another extraction (without ``resume`` / ``overwrite``),
            or one with other settings; every image unreadable or too large.
        CaptionsError: a captions file naming an image outside ``images`` (without
            ``allow_outside_root``), a split or id that is not a plain name, a name with a
            control character (the entry named).
        ValueError: bad arguments, e.g. a layout that cannot hold the captions, an unknown
            pipeline setting, or a negative ``progress_every``.

    Example:
        >>> from xmatch.extract import extract
        >>> result = extract("my_photos", "feats", {"proposer": "windows", "roi": {"image_size": 320}})  # needs the user's photos  # doctest: +SKIP
        >>> print(result.summary())  # doctest: +SKIP
        120 images (test 120) in feats (teran layout, 1280-d features): 120 extracted, 0 already done in 14.2 s
    """
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {', '.join(LAYOUTS)}, got {layout!r}.")
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}.")
    workers = decoding_workers() if workers is None else workers
    if batch_size < 1 or workers < 0:
        raise ValueError(f"batch_size must be at least 1 and workers at least 0, got {batch_size}, {workers}.")
    if max_pixels < 1 or max_batch_pixels < 1:
        raise ValueError(f"max_pixels and max_batch_pixels must be at least 1, got {max_pixels}, {max_batch_pixels}.")
    if progress_every is not None and not progress_every >= 0:
        raise ValueError(f"progress_every must be 0 seconds or more, got {progress_every}.")
    if resume and overwrite:
        raise ValueError("resume continues the previous run and overwrite removes it; choose one.")
    if ray_workers is not None and (ray is None or ray_workers < 1):
        raise ValueError(f"ray_workers (--ray-workers) is the number of Ray workers, at least 1, and needs ray (--ray); "
                         f"got {ray_workers} with ray={ray!r}.")
    procs = Processes.join(device)
    if ray is not None and procs.world > 1:
        procs.leave()
        raise ValueError("ray runs the chunks on a Ray cluster's workers; start one process (not torchrun) to drive it.")
    try:
        records, source = read_records(images, captions, split, allow_outside_root=allow_outside_root)
        pipe = pipeline if isinstance(pipeline, RegionPipeline) else RegionPipeline.from_table(
            {} if pipeline is None else pipeline)
        pipe = pipe.to(procs.device).eval()
        start = time.perf_counter()
        if layout == "precomp":
            check_precomp(records, pipe.fixed_regions)
        out = Path(out).expanduser()
        pixels = {"max": max_pixels, "max_batch": max_batch_pixels}
        manifest = _manifest(layout, dtype, batch_size, pipe, records, images, source, pixels)
        files = RegionFiles(out if layout == "teran" else out / STATE / "parts", dtype)
        status = _prepare(out, manifest, resume, overwrite, files) if procs.is_main else None
        status = procs.broadcast(status)
        if isinstance(status, str) and status.startswith("error:"):
            raise ExtractError(status[len("error:"):])
        if status == "complete":
            return _result(out, read_manifest(out), 0, len(records), time.perf_counter() - start)
        chunks = [records[i : i + batch_size] for i in range(0, len(records), batch_size)]
        mine = [k for k in range(len(chunks)) if k % procs.world == procs.rank]
        pending = [k for k in mine if not chunk_file(out, k).is_file()]
        skipped = sum(len(chunks[k]) for k in mine if k not in pending)
        logger.info("extracting %d images into %s: %d to do here, %d already done", len(records), out,
                    sum(len(chunks[k]) for k in pending), skipped)
        chunk_set = ChunkSet(chunks, pending, pipe.loader(max_pixels), max_batch_pixels)
        finished = _FinishedSplits(out, records, chunks) if layout == "teran" and procs.is_main else None
        if finished is not None:
            finished.update()  # the splits a resumed run had finished
        chunk_done = finished.update if finished is not None else None
        if ray is None:
            extracted = _run_chunks(pipe, chunk_set, files, out, workers, progress and procs.is_main, skipped,
                                    sum(len(chunks[k]) for k in mine), progress_every, chunk_done)
        else:
            from xmatch.extract.ray_run import run_chunks_on_ray

            extracted = run_chunks_on_ray(ray, ray_workers, pipe, chunk_set, files, out, progress, skipped,
                                          progress_every, chunk_done)
        procs.barrier()
        if procs.is_main:
            manifest = _finish(out, manifest, records, len(chunks), layout, dtype)
        procs.barrier()
        return _result(out, manifest if procs.is_main else read_manifest(out), extracted, skipped,
                       time.perf_counter() - start)
    finally:
        procs.leave()


def decoding_workers(cores: int | None = None) -> int:
    """The default number of decoding processes: none on a machine of ``cores`` (default: this
    one's) two or fewer, else 2.

    On two cores the backbone's threads keep both busy, so a decoding process only competes
    with them and adds its start and its transfers: on a loaded 2-core machine ``xmatch
    extract`` ran 1.2x faster at 224 px without one, and alike at 600 px, where decoding is a
    twentieth of the work (docs/extract.md, Throughput).

    Example:
        >>> decoding_workers(2), decoding_workers(8)
        (0, 2)
    """
    cores = (os.cpu_count() or 1) if cores is None else cores
    return 0 if cores <= 2 else 2


# -- the chunks ---------------------------------------------------------------------------


def _unbatched(item: Any) -> Any:
    return item


def _run_chunks(
    pipe: RegionPipeline,
    chunk_set: ChunkSet,
    files: RegionFiles,
    out: Path,
    workers: int,
    progress: bool,
    skipped: int,
    total: int,
    progress_every: float | None = None,
    chunk_done: Callable[[], None] | None = None,
) -> int:
    from xmatch.core.progress import progress_bar

    loader = torch.utils.data.DataLoader(
        chunk_set, batch_size=None, shuffle=False, num_workers=min(workers, len(chunk_set)), collate_fn=_unbatched,
    )
    done = 0
    bar = progress_bar(total=total, initial=skipped, desc="extract", unit="img", show=progress, every=progress_every)
    with bar:
        for k, parts, first in loader:
            done += run_chunk(pipe, chunk_set, files, out, k, parts, first, bar.update)
            if chunk_done is not None:
                chunk_done()
    return done


class _FinishedSplits:
    """The teran layout's dataset file, written again each time a split is finished: every chunk
    holding one of its images has its record (written by any process: under ``torchrun`` the
    first process looks at the records on disk)."""

    def __init__(self, out: Path, records: list[ImageRecord], chunks: list[list[ImageRecord]]) -> None:
        self.out, self.records = out, records
        self.chunks: dict[str, list[int]] = {}  # split -> the chunks holding its images, in order
        for k, chunk in enumerate(chunks):
            for record in chunk:
                of_split = self.chunks.setdefault(record.split, [])
                if not of_split or of_split[-1] != k:
                    of_split.append(k)
        self.waiting = {split: deque(ks) for split, ks in self.chunks.items()}  # chunks not yet seen finished

    def update(self) -> None:
        """Write the dataset file if a split was finished since the last call (records are
        never removed, so each split's chunks are looked at once, in order)."""
        newly = False
        for split, left in list(self.waiting.items()):
            while left and chunk_file(self.out, left[0]).is_file():
                left.popleft()
            if not left:
                del self.waiting[split]
                newly = True
        if newly and self.waiting:  # with every split finished, the run's end writes the whole file
            self._write()

    def _write(self) -> None:
        done = [split for split in self.chunks if split not in self.waiting]
        sizes: dict[str, tuple[int, int]] = {}
        for k in sorted({k for split in done for k in self.chunks[split]}):
            sizes.update({key: tuple(v) for key, v in read_chunk(self.out, k)["sizes"].items()})
        readable = [r for r in self.records if r.split in done and r.key in sizes]
        doc = {**karpathy_document(readable, sizes), "finished_splits": done, "pending_splits": list(self.waiting)}
        write_json_atomic(self.out / DATASET_FILE, doc)


# -- the output folder and the manifest ----------------------------------------------------


def _manifest(
    layout: str, dtype: str, batch_size: int, pipe: RegionPipeline, records: Sequence[ImageRecord],
    images: str | os.PathLike, source: str, pixels: dict[str, int],
) -> dict[str, Any]:
    from xmatch.core.version import __version__

    digest = hashlib.sha256("\n".join(f"{r.key}\t{r.name}" for r in records).encode()).hexdigest()
    proposer = pipe.proposer
    return {
        "format": FORMAT,
        "xmatch": __version__,
        "complete": False,
        "layout": layout,
        "dtype": dtype,
        "batch_size": batch_size,
        "pixels": pixels,
        "feature_dim": pipe.feature_dim,
        "regions": {"max": proposer.regions, "min": getattr(proposer, "min_regions", proposer.regions)},
        "pipeline": pipe.describe(),
        "images": {"count": len(records), "digest": f"sha256:{digest}"},
        "images_folder": str(Path(images).expanduser().resolve()),
        "captions": source,
    }


def _prepare(out: Path, manifest: dict[str, Any], resume: bool, overwrite: bool, files: RegionFiles) -> str:
    """Make ``out`` ready (first process only, before the others start writing): ``"fresh"``,
    ``"resume"``, ``"complete"``, or ``"error:<message>"`` (so that every process can raise it)."""
    path = out / MANIFEST
    if path.is_file():
        try:
            old = read_manifest(out)
        except ManifestError as exc:
            if not overwrite:
                return f"error:{exc}"
            old = {}
        if overwrite:
            _remove_outputs(out)
        elif not resume:
            return (f"error:{out} already holds an extraction ({path}); pass --resume to continue it or "
                    "--overwrite to start again.")
        else:
            recorded = {k: old.get(k) for k in COMPARED}
            recorded["pipeline"] = canonical_pipeline(recorded["pipeline"])
            differences = settings_differences(recorded, {k: manifest[k] for k in COMPARED})
            if differences:
                return (f"error:--resume: {path} was made with other settings ({'; '.join(differences[:6])}); "
                        "use the same ones, or --overwrite / another --out.")
            if old.get("complete"):
                logger.info("%s is already complete; nothing to do", out)
                return "complete"
    else:
        found = [p.name for p in (out / "bu_att", out / "bu_box", out / DATASET_FILE) if p.exists()]
        found += [p.name for p in out.glob("*_ims.npy")] if out.is_dir() else []
        if found:
            return (f"error:{out} holds region features that xmatch extract did not write ({', '.join(found)}) "
                    "and no extract.json; choose another --out.")
        if resume:
            logger.info("nothing to resume in %s; starting", out)
    out.mkdir(parents=True, exist_ok=True)
    (out / STATE).mkdir(exist_ok=True)
    files.create()  # also removes the temporary files of a killed run
    write_json_atomic(path, manifest)
    return "resume" if resume else "fresh"


def _remove_outputs(out: Path) -> None:
    """Remove what a previous ``xmatch extract`` wrote into ``out`` (and nothing else)."""
    for name in ("bu_att", "bu_box", STATE):
        if (out / name).is_dir():
            shutil.rmtree(out / name)
    patterns = (MANIFEST, DATASET_FILE, "*_ims.npy", "*_caps.txt", "*_boxes.npy", "*_img_sizes.npy", "*_images.txt")
    for pattern in patterns:
        for f in out.glob(pattern):
            f.unlink()


def _finish(out: Path, manifest: dict[str, Any], records: list[ImageRecord], n_chunks: int, layout: str, dtype: str) -> dict[str, Any]:
    """Gather the chunk records, write the dataset files and the complete manifest."""
    missing = [k for k in range(n_chunks) if not chunk_file(out, k).is_file()]
    if missing:
        raise ExtractError(f"{len(missing)} chunks of {out} were not extracted (e.g. chunk {missing[0]}); rerun with --resume.")
    sizes: dict[str, tuple[int, int]] = {}
    unreadable: list[list[str]] = []
    for k in range(n_chunks):
        doc = read_chunk(out, k)
        sizes.update({key: tuple(v) for key, v in doc["sizes"].items()})
        unreadable += doc["unreadable"]
    readable = [r for r in records if r.key in sizes]
    if not readable:
        raise ExtractError(f"none of the {len(records)} images could be read (e.g. {unreadable[0][1]}); nothing was written.")
    if layout == "teran":
        write_teran(out, readable, sizes)
    else:
        write_precomp(out, readable, sizes, dtype, RegionFiles(out / STATE / "parts"))
    splits: dict[str, int] = {}
    for r in readable:
        key = PRECOMP_PREFIX.get(r.split, r.split) if layout == "precomp" else r.split
        splits[key] = splits.get(key, 0) + 1
    manifest = {**manifest, "complete": True, "splits": splits, "unreadable": unreadable,
                "captions_per_image": sorted({len(r.captions) for r in readable})}
    write_json_atomic(out / MANIFEST, manifest)
    shutil.rmtree(out / STATE)
    return manifest


def _result(out: Path, manifest: dict[str, Any], extracted: int, skipped: int, seconds: float) -> ExtractResult:
    splits = manifest.get("splits", {})
    return ExtractResult(
        out, manifest["layout"], sum(splits.values()), extracted, skipped,
        [tuple(u) for u in manifest.get("unreadable", [])], manifest["feature_dim"], seconds,
        manifest.get("captions", ""), splits, list(manifest.get("captions_per_image", [])),
    )


# -- several processes (torchrun) ------------------------------------------------------------


@dataclass
class Processes:
    """This process's place among those ``torchrun`` started (one process: rank 0 of 1)."""

    rank: int
    world: int
    device: torch.device
    owns_group: bool = False

    @classmethod
    def join(cls, device: str | torch.device | None) -> Processes:
        import torch.distributed as dist

        from xmatch.core.devices import resolve_device

        world = int(os.environ.get("WORLD_SIZE", "1"))
        rank = int(os.environ.get("RANK", "0"))
        resolved = resolve_device(device, default="auto")
        if resolved.type == "cuda" and world > 1:
            resolved = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        owns = False
        if world > 1 and not dist.is_initialized():
            dist.init_process_group(backend="nccl" if resolved.type == "cuda" else "gloo")
            owns = True
        return cls(rank, world, resolved, owns)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def barrier(self) -> None:
        if self.world > 1:
            import torch.distributed as dist

            dist.barrier()

    def broadcast(self, obj: Any) -> Any:
        if self.world == 1:
            return obj
        import torch.distributed as dist

        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def leave(self) -> None:
        if self.owns_group:
            import torch.distributed as dist

            dist.destroy_process_group()
