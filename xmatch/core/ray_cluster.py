"""Ray as the engine that spreads extraction and encoding over workers (``--ray [ADDRESS]``).

``ray[data]`` is an optional extra (``pip install 'xmatch-zoo[ray]'``); it is imported only
when a run asks for it. The work of a run is cut into fixed chunks by the run itself (a chunk
is what one process would compute and write in one go); Ray Data hands the pending chunks to an
actor pool (:func:`map_chunks`), each actor holding the model once, as Ray's batch-inference
guide recommends. A worker that dies has its chunk redone on a restarted actor; the chunk
records on disk let a killed driver resume.
"""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any

#: ``--ray`` without an address: start a local Ray (or join the one ``RAY_ADDRESS`` names)
LOCAL = "local"
#: restarts of a dead actor, and retries of the chunk it held: a chunk that kills its worker
#: this many times (a picture that exhausts memory) stops the run instead of looping
MAX_RESTARTS = 3


def ray_module(feature: str) -> ModuleType:
    """``ray`` with Ray Data, or an error naming ``pip install 'xmatch-zoo[ray]'``.

    Example:
        >>> ray_module("xmatch extract --ray").__name__  # with the ray extra installed  # doctest: +SKIP
        'ray'
    """
    from xmatch.core.optional import require

    require("ray.data", "xmatch-zoo[ray]", feature)
    import ray

    return ray


def connect(address: str, feature: str) -> ModuleType:
    """Join a Ray cluster: the one this process already joined, a local one (``address``
    :data:`LOCAL`: ``ray.init()`` starts one, or joins the cluster ``RAY_ADDRESS`` names), or the
    one at ``address`` (``auto``, ``HOST:6379``, ``ray://HOST:10001``).

    Raises:
        MissingDependencyError: Ray is not installed (the message gives the pip command).

    Example:
        >>> ray = connect("local", "xmatch extract --ray")  # starts a local Ray (seconds)  # doctest: +SKIP
        >>> cluster_cpus(ray)  # doctest: +SKIP
        2
    """
    ray = ray_module(feature)
    if not ray.is_initialized():
        ray.init(address=None if address == LOCAL else address, include_dashboard=False, log_to_driver=False,
                 logging_level="WARNING")
    return ray


@dataclass(frozen=True)
class WorkerPlan:
    """How many actors run a job and the threads (CPUs) each gets.

    Example:
        >>> WorkerPlan.of(cluster_cpus=8, workers=None, chunks=100)
        WorkerPlan(workers=8, threads=1)
        >>> WorkerPlan.of(cluster_cpus=8, workers=2, chunks=100)
        WorkerPlan(workers=2, threads=4)
        >>> WorkerPlan.of(cluster_cpus=8, workers=4, chunks=3)  # never more actors than chunks
        WorkerPlan(workers=3, threads=2)
    """

    workers: int
    threads: int

    @classmethod
    def of(cls, cluster_cpus: int, workers: int | None, chunks: int, threads: int | None = None) -> WorkerPlan:
        """``workers`` actors (default one per CPU of the cluster, at most one per chunk), each
        with ``threads`` threads (default: the cluster's CPUs divided among them, at least one)."""
        if workers is not None and workers < 1:
            raise ValueError(f"ray_workers must be at least 1, got {workers}.")
        cpus = max(1, int(cluster_cpus))
        wanted = cpus if workers is None else workers
        return cls(max(1, min(wanted, chunks)), max(1, cpus // wanted) if threads is None else threads)


def threads_from_environment(environ: Mapping[str, str] = os.environ) -> int | None:
    """The threads per worker ``OMP_NUM_THREADS`` asks for in the driver's environment (a whole
    number of at least 1), or None where it is not set: a user who limits threads means it for
    the workers too, and a worker's threads decide the last bits of its floats.

    Example:
        >>> threads_from_environment({"OMP_NUM_THREADS": "1"}), threads_from_environment({})
        (1, None)
    """
    value = environ.get("OMP_NUM_THREADS", "")
    return int(value) if value.isdigit() and int(value) >= 1 else None


def use_threads(threads: int) -> None:
    """Give this worker process ``threads`` threads for torch's kernels (and for the libraries
    that read ``OMP_NUM_THREADS`` later): workers sharing a machine must not each take every core.

    Example:
        >>> use_threads(1); torch.get_num_threads()  # in a Ray worker: it changes this process's threads  # doctest: +SKIP
        1
    """
    import torch

    os.environ["OMP_NUM_THREADS"] = str(threads)
    torch.set_num_threads(threads)


def map_chunks(
    ray: ModuleType,
    chunks: list[int],
    actor: type,
    constructor_kwargs: dict[str, Any],
    plan: WorkerPlan,
    *,
    gpus: float = 0,
    progress: bool = False,
) -> Iterator[dict[str, Any]]:
    """Run ``actor`` (a callable class: ``__init__(**constructor_kwargs)`` loads the model once,
    ``__call__({"chunk": array})`` computes and writes those chunks and returns one row per
    chunk) over the chunk numbers ``chunks`` on an actor pool; yields each returned row as its
    chunk finishes.

    Example:
        >>> class Double:
        ...     def __init__(self, threads): use_threads(threads)
        ...     def __call__(self, batch): return {"chunk": batch["chunk"], "twice": 2 * batch["chunk"]}
        >>> sorted(int(row["twice"]) for row in map_chunks(ray, [0, 1, 2], Double, {}, WorkerPlan(2, 1)))  # needs Ray  # doctest: +SKIP
        [0, 2, 4]
    """
    logging.getLogger("ray.data").setLevel(logging.WARNING)  # a line per finished dataset is noise in a job's log
    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = progress
    context.print_on_execution_start = False
    dataset = ray.data.from_items([{"chunk": k} for k in chunks], override_num_blocks=max(1, len(chunks)))
    with warnings.catch_warnings():
        # Ray 2.5x deprecates remote arguments passed as keywords, and has no named parameter
        # for these two yet; without them a chunk that always kills its worker would loop
        warnings.filterwarnings("ignore", message=".*ray_remote_args.*", category=DeprecationWarning)
        mapped = dataset.map_batches(
            actor, fn_constructor_kwargs=constructor_kwargs | {"threads": plan.threads}, batch_size=1,
            compute=ray.data.ActorPoolStrategy(size=plan.workers), num_cpus=plan.threads, num_gpus=gpus,
            max_restarts=MAX_RESTARTS, max_task_retries=MAX_RESTARTS,
        )
    for row in mapped.iter_rows():
        yield row


def cluster_cpus(ray: ModuleType) -> int:
    """The CPUs of the cluster this process joined (see :func:`connect`'s example)."""
    return int(ray.cluster_resources().get("CPU", 1))

