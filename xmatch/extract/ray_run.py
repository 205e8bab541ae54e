"""The extraction's chunks computed on a Ray cluster (``xmatch extract --ray [ADDRESS]``).

The run (:func:`xmatch.extract.run.extract`) cuts the images into its fixed chunks and prepares
``OUT`` as for one process; Ray Data then hands the pending chunk numbers to an actor pool. Each
actor holds the region pipeline once and runs a chunk through the same code as one process
(:func:`xmatch.extract.chunks.run_chunk`): its region files, then its chunk record in
``OUT/.extract/``, each written to a temporary name and renamed into place. The driver (this
process) follows the records as chunks finish and, at the end, writes the dataset files and
the manifest as one process does, so the bytes are the same.

A worker that dies (killed, out of memory) has its chunk redone on a restarted actor (Ray's
``max_restarts`` / ``max_task_retries``); a killed driver leaves the finished chunks' records,
and ``resume`` computes only the others. The region files of a chunk redone are written again
with the same bytes.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from xmatch.core.progress import progress_bar
from xmatch.core.ray_cluster import WorkerPlan, cluster_cpus, connect, map_chunks, threads_from_environment, use_threads
from xmatch.extract.chunks import ChunkSet, run_chunk
from xmatch.extract.writers import RegionFiles
from xmatch.regions.pipeline import RegionPipeline


class ChunkWorker:
    """A Ray actor of the extraction: the pipeline held once, chunks computed and written
    (:func:`run_chunks_on_ray` starts a pool of them; ``__call__`` takes ``{"chunk": [k, ...]}``).

    Args:
        pipeline: the region pipeline (or Ray's reference to it, fetched once here).
        chunk_set: the run's chunks and how their pictures are loaded.
        folder: where the region files go; ``dtype`` their features' type.
        out: the output folder (chunk records in ``out/.extract``).
        device: ``cpu`` or ``cuda`` (the actor's GPU).
        threads: torch threads of this worker.
    """

    def __init__(self, pipeline: Any, chunk_set: Any, folder: str, dtype: str, out: str, device: str, threads: int) -> None:
        import ray

        from xmatch.core.memory import keep_freed_memory

        use_threads(threads)
        keep_freed_memory()  # an actor's process extracts and nothing else, as xmatch extract's does
        fetch = (lambda value: ray.get(value) if isinstance(value, ray.ObjectRef) else value)
        self.pipe: RegionPipeline = fetch(pipeline).to(device).eval()
        self.chunk_set: ChunkSet = fetch(chunk_set)
        self.files = RegionFiles(Path(folder), dtype)
        self.out = Path(out)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        images, extracted = [], []
        for k in batch["chunk"].tolist():
            k, parts, first = self.chunk_set.chunk(int(k))
            extracted.append(run_chunk(self.pipe, self.chunk_set, self.files, self.out, k, parts, first))
            images.append(sum(len(part) for part in parts))
        return {"chunk": batch["chunk"], "images": np.array(images), "extracted": np.array(extracted)}


def run_chunks_on_ray(
    address: str,
    workers: int | None,
    pipe: RegionPipeline,
    chunk_set: ChunkSet,
    files: RegionFiles,
    out: Path,
    progress: bool,
    skipped: int,
    progress_every: float | None,
    chunk_done: Callable[[], None] | None,
) -> int:
    """Compute the pending chunks of ``chunk_set`` on the Ray cluster at ``address`` with
    ``workers`` actors; the images extracted (the records are on disk when it returns).
    :func:`xmatch.extract.extract` calls it with ``ray=ADDRESS``, after preparing ``out``.

    Example:
        >>> extract("my_photos", "feats", ray="local", ray_workers=2).extracted  # needs Ray and the user's photos  # doctest: +SKIP
        120
    """
    ray = connect(address, "xmatch extract --ray")
    pending = list(chunk_set.pending)
    if not pending:
        return 0
    plan = WorkerPlan.of(cluster_cpus(ray), workers, len(pending), threads_from_environment())
    device = next(pipe.parameters(), torch.empty(0)).device.type
    total = sum(len(c) for c in chunk_set.chunks)
    bar = progress_bar(total=total, initial=skipped, desc="extract (ray)", unit="img", show=progress, every=progress_every)
    kwargs = {
        "pipeline": ray.put(pipe.to("cpu")), "chunk_set": ray.put(chunk_set), "folder": str(files.att.parent),
        "dtype": files.dtype.name, "out": str(out), "device": device,
    }
    done = 0
    with bar:
        for row in map_chunks(ray, pending, ChunkWorker, kwargs, plan, gpus=1 if device == "cuda" else 0):
            done += int(row["extracted"])
            bar.update(int(row["images"]))
            if chunk_done is not None:
                chunk_done()
    return done
