"""Fill an index on a Ray cluster (``xmatch index ... --ray [ADDRESS]``): items encoded by many
workers, committed into one index at once.

The items still to index are cut into the chunks one process would commit as shards (a
dataset: whole encoding batches up to ``shard_size`` items, as :func:`xmatch.index.build.index_dataset`
commits them; a picture folder: ``shard_size`` pictures, as :func:`xmatch.index.photos.index_images`).
Ray Data hands the chunk numbers to an actor pool; each actor holds the model once, encodes a
chunk as one process would and writes its shard file and a record of the chunk into the
index's ``staging/`` folder. Nothing of it is visible to a reader: the index's manifest lists
none of these files. When every chunk is staged, this process moves the shard files into
``shards/`` and commits them all in one manifest write (the index's commit point), so the index
holds the shards a single process would have written, in the same order, and searches give the
same results.

A worker that dies has its chunk redone on a restarted actor. A killed driver leaves the staged
chunks: running again with ``resume=True`` (``--append``) encodes only the chunks not staged, as
long as the index was not changed meanwhile (its manifest's generation is part of the plan
recorded in ``staging/plan.json``; another plan starts the staging anew). The stage-1 structure
is built once, afterwards, by :meth:`SearchIndex.prepare` (its centroids trained on a sample of
the committed items, then filled).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from xmatch.core.progress import progress_bar
from xmatch.core.ray_cluster import LOCAL, WorkerPlan, cluster_cpus, connect, map_chunks, threads_from_environment, use_threads
from xmatch.index import checks
from xmatch.index.errors import SearchIndexError
from xmatch.index.search import SearchIndex, check_compute_dtype
from xmatch.index.shards import fsync_dir, write_shard
from xmatch.index.store import SHARDS, own_folder, write_manifest
from xmatch.io.files import move_into_place
from xmatch.io.pictures import MAX_PIXELS
from xmatch.model.embeddings import Embeddings

#: the index's folder for the shards of a run not yet committed (an own folder of the index)
STAGING = "staging"
PLAN = "plan.json"


def index_dataset_on_ray(
    index: SearchIndex,
    dataset: Any,
    *,
    batch_size: int = 64,
    shard_size: int = 1024,
    resume: bool = False,
    progress: bool = True,
    compute_dtype: str = "float32",
    ray: str = LOCAL,
    ray_workers: int | None = None,
) -> int:
    """:func:`xmatch.index.build.index_dataset` with the encoding spread over a Ray cluster's
    workers and every shard committed at once at the end (the same shards, the same results).

    Args:
        index: an index of the embedded (``faiss``) engine.
        dataset: as :func:`~xmatch.index.build.index_dataset`'s; it travels to the workers.
        batch_size, shard_size, resume, progress, compute_dtype: as
            :func:`~xmatch.index.build.index_dataset`'s (``resume`` also continues the staged
            chunks of a killed run).
        ray: ``"local"`` (start or join a local Ray) or a cluster's address (``auto``, ``HOST:6379``).
        ray_workers: Ray actors, each holding the model once (default: one per CPU).

    Returns:
        The number of items added.

    Example:
        >>> index = xmatch.index.create("idx", model, model_ref="teran-mrsw-scenes")  # needs Ray and the scenes (minutes)  # doctest: +SKIP
        >>> index_dataset_on_ray(index, xmatch.scenes.dataset.open_scenes(split="test"), ray="local")  # doctest: +SKIP
        100
    """
    from xmatch.index.build import caption_ids
    from xmatch.index.photos import dataset_pictures

    _check(index, batch_size, shard_size, compute_dtype, ray_workers)
    if index.side == "texts" and not len(dataset.captions):
        raise ValueError(f"{index.root} is a caption index and the dataset has no captions ({dataset!r}).")
    ids = list(dataset.image_names) if index.side == "images" else caption_ids(dataset)
    present = set(index.ids) if resume else set()
    remaining = [k for k, i in enumerate(ids) if i not in present]
    step = batch_size if index.side == "images" else 4 * batch_size
    per_shard = math.ceil(shard_size / step) * step  # whole batches, as index_dataset commits them
    chunks = [remaining[i : i + per_shard] for i in range(0, len(remaining), per_shard)]
    source = {"kind": "dataset", "dataset": dataset, "ids": ids}
    added, _ = _build(index, chunks, [[ids[k] for k in c] for c in chunks], source, batch_size, shard_size,
                      progress, compute_dtype, ray, ray_workers, resume)
    if index.side == "images" and index.pictures is None:
        folder = dataset_pictures(dataset, index.ids)
        if folder is not None:
            index.record_pictures(folder)
    return added


def index_images_on_ray(
    index: SearchIndex,
    folder: str | os.PathLike,
    *,
    batch_size: int = 64,
    shard_size: int = 1024,
    resume: bool = False,
    progress: bool = True,
    max_pixels: int = MAX_PIXELS,
    compute_dtype: str = "float32",
    ray: str = LOCAL,
    ray_workers: int | None = None,
) -> tuple[int, list[tuple[str, str]]]:
    """:func:`xmatch.index.photos.index_images` with the pictures encoded by a Ray cluster's
    workers and every shard committed at once at the end (the same shards, the same results).

    Args:
        index: an image index of the embedded (``faiss``) engine, of a model that reads pixels.
        folder: the picture folder, or WebDataset shards (as ``index_images`` reads them); every
            worker reads them: on several machines, from shared storage.
        batch_size, shard_size, resume, progress, max_pixels, compute_dtype: as
            :func:`~xmatch.index.photos.index_images`'s.
        ray: ``"local"`` (start or join a local Ray) or a cluster's address.
        ray_workers: Ray actors, each holding the model once (default: one per CPU).

    Returns:
        ``(pictures added, [(relative path, why skipped), ...])``, as ``index_images``.

    Example:
        >>> index = xmatch.index.create("photos-idx", xmatch.build("clip-vit-b-32", pretrained=True))  # needs the hub and Ray  # doctest: +SKIP
        >>> index_images_on_ray(index, "my_photos", ray="local")  # doctest: +SKIP
        (120, [])
    """
    from xmatch.data.webdataset import names_shards
    from xmatch.index.photos import holds_pictures, pictures_to_index
    from xmatch.model.inputs import PixelInputs, input_type_of

    _check(index, batch_size, shard_size, compute_dtype, ray_workers)
    if index.side != "images" or input_type_of(index.model.image_encoder) is not PixelInputs:
        raise SearchIndexError(f"{index.root}: pictures go to an image index of a model that reads pixels "
                               "(see xmatch.index.photos.index_images).")
    root = Path(folder).expanduser()
    shards = names_shards(folder)
    candidates, skipped = pictures_to_index(folder, max_pixels)
    present = set(index.ids) if resume else set()
    unindexed = [(n, where) for n, where in candidates if n not in present]
    chunks = [unindexed[i : i + shard_size] for i in range(0, len(unindexed), shard_size)]
    source = {"kind": "pictures", "max_pixels": max_pixels}
    added, unread = _build(index, chunks, [[n for n, _ in c] for c in chunks], source, batch_size, shard_size,
                           progress, compute_dtype, ray, ray_workers, resume)
    if not shards and index.pictures is None and holds_pictures(root, index.ids):
        index.record_pictures(root)
    return added, skipped + unread


def _check(index: SearchIndex, batch_size: int, shard_size: int, compute_dtype: str, workers: int | None) -> None:
    if index.engine != "faiss":
        raise SearchIndexError(
            f"{index.root} keeps its items in Qdrant; --ray builds an embedded (faiss) index: build one, then move "
            "it into Qdrant with xmatch index --from-index INDEX --engine qdrant."
        )
    if shard_size < 1 or batch_size < 1:
        raise ValueError(f"batch_size and shard_size must be positive, got {batch_size} and {shard_size}.")
    if workers is not None and workers < 1:
        raise ValueError(f"ray_workers (--ray-workers) must be at least 1, got {workers}.")
    check_compute_dtype(compute_dtype)


def _build(
    index: SearchIndex, chunks: list[list[Any]], chunk_ids: list[list[str]], source: dict[str, Any],
    batch_size: int, shard_size: int, progress: bool, compute_dtype: str, address: str, workers: int | None,
    resume: bool,
) -> tuple[int, list[tuple[str, str]]]:
    """Stage every chunk (on Ray), then commit them in one manifest write; ``(added, skipped)``."""
    if not resume:  # refused now, not after the encoding: these ids would be refused at the commit
        present = set(index.ids)
        clash = next((i for c in chunk_ids for i in c if i in present), None)
        if clash is not None:
            raise SearchIndexError(f"id {clash!r} is already in the index {index.root}; ids must be unique "
                                   "(resume / --append skips the ids it holds).")
    if not chunks:
        return 0, []
    staging = _staging(index, chunk_ids, batch_size, shard_size, compute_dtype)
    pending = [j for j in range(len(chunks)) if not _staged(staging, j)]
    if pending:
        ray = connect(address, "xmatch index --ray")
        plan = WorkerPlan.of(cluster_cpus(ray), workers, len(pending), threads_from_environment())
        kwargs = {
            "model": ray.put(index.model.to("cpu")), "source": ray.put(source), "chunks": ray.put(chunks),
            "root": str(index.root), "manifest": index.manifest, "staging": str(staging),
            "batch_size": batch_size, "compute_dtype": compute_dtype,
        }
        total = sum(len(c) for c in chunks)
        bar = progress_bar(total=total, initial=total - sum(len(chunks[j]) for j in pending),
                           desc=f"index {index.side} (ray)", unit="item", show=progress)
        with bar:
            for row in map_chunks(ray, pending, EncodeWorker, kwargs, plan):
                bar.update(int(row["items"]))
    return _commit(index, staging, len(chunks))


def write_json_atomic(path: Path, doc: Any) -> None:
    """``doc`` as JSON into ``path`` through a temporary file, flushed, and a rename: a record
    is complete or absent."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(doc, f)
        f.flush()
        os.fsync(f.fileno())
    move_into_place(tmp, path)


def _plan(index: SearchIndex, chunk_ids: list[list[str]], batch_size: int, shard_size: int, compute_dtype: str) -> dict[str, Any]:
    digest = hashlib.sha256("\n".join("\t".join(c) for c in chunk_ids).encode()).hexdigest()
    return {"generation": index.manifest.get("generation"), "chunks": f"sha256:{digest}", "batch_size": batch_size,
            "shard_size": shard_size, "compute_dtype": compute_dtype}


def _staging(index: SearchIndex, chunk_ids: list[list[str]], batch_size: int, shard_size: int, compute_dtype: str) -> Path:
    """The staging folder of this run: kept where it holds the same plan (a killed run of the
    same items into the same committed index), else emptied."""
    plan = _plan(index, chunk_ids, batch_size, shard_size, compute_dtype)
    folder = own_folder(index.root, STAGING, create=False)
    try:
        same = json.loads((folder / PLAN).read_text(encoding="utf-8")) == plan
    except (OSError, ValueError):
        same = False
    if not same:
        if folder.is_dir():
            shutil.rmtree(folder)
        folder.mkdir()
        write_json_atomic(folder / PLAN, plan)
    return folder


def _record(staging: Path, j: int) -> Path:
    return staging / f"chunk-{j:07d}.json"


def _staged(staging: Path, j: int) -> bool:
    """Whether chunk ``j`` is staged: its record, and its shard file unless it has no item."""
    try:
        record = json.loads(_record(staging, j).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return record.get("shard") is None or (staging / record["shard"]).is_file()


class EncodeWorker:
    """A Ray actor of the index: the model held once; a chunk encoded, its shard staged.

    Args:
        model: the index's model (Ray's reference to it, fetched once here).
        source: what the chunks are items of (a dataset, or a picture folder).
        chunks: the item numbers (dataset) or ``(picture name, file or shard member)`` of each chunk.
        root, manifest: the index (opened here read-only, for its checks and box rules).
        staging: where the shard files and chunk records go.
        batch_size, compute_dtype: the encoding's.
        threads: torch threads of this worker.
    """

    def __init__(self, model: Any, source: Any, chunks: Any, root: str, manifest: dict[str, Any], staging: str,
                 batch_size: int, compute_dtype: str, threads: int) -> None:
        import ray

        use_threads(threads)
        fetch = (lambda value: ray.get(value) if isinstance(value, ray.ObjectRef) else value)
        self.index = SearchIndex(Path(root), manifest, fetch(model).eval())
        self.source, self.chunks = fetch(source), fetch(chunks)
        self.staging, self.batch_size, self.compute_dtype = Path(staging), batch_size, compute_dtype

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        items = [self.stage(int(j)) for j in batch["chunk"].tolist()]
        return {"chunk": batch["chunk"], "items": np.array(items)}

    def stage(self, j: int) -> int:
        """Encode chunk ``j``, write its shard file, then its record; the items it holds."""
        if self.source["kind"] == "pictures":
            embeddings, ids, boxes, texts, skipped = self._pictures(self.chunks[j])
        else:
            embeddings, ids, boxes, texts, skipped = self._dataset(self.chunks[j])
        record: dict[str, Any] = {"shard": None, "ids": ids, "skipped": skipped}
        if ids:
            name = f"chunk-{j:07d}.safetensors"
            record |= {"shard": name, "info": stage_shard(self.index, self.staging / name, embeddings, ids, boxes, texts)}
        write_json_atomic(_record(self.staging, j), record)
        return len(self.chunks[j])

    def _dataset(self, rows: list[int]) -> tuple[Embeddings, list[str], torch.Tensor | None, list[str] | None, list]:
        from xmatch.index.build import _encoded

        dataset, ids = self.source["dataset"], self.source["ids"]
        parts = list(_encoded(self.index, dataset, rows, self.batch_size, self.compute_dtype))
        embeddings = Embeddings.cat([e for e, _, _ in parts])
        boxes = None
        if all(b is not None for _, b, _ in parts):
            width = embeddings.tokens.shape[1]
            boxes = torch.cat([torch.nn.functional.pad(b, (0, 0, 0, width - b.shape[1])) for _, b, _ in parts])
        texts = [dataset.captions[k] for k in rows] if self.index.side == "texts" else None
        return embeddings, [ids[k] for k in rows], boxes, texts, []

    def _pictures(self, pairs: list[tuple[str, Any]]) -> tuple[Embeddings | None, list[str], torch.Tensor | None, None, list]:
        from xmatch.index.photos import _load
        from xmatch.index.search import _image_inputs, encoding
        from xmatch.model.inputs import PixelInputs

        pictures, ids, skipped = [], [], []
        for name, where in pairs:
            picture, why = _load(where, self.source["max_pixels"])
            if picture is None:
                skipped.append((name, why))
            else:
                pictures.append(picture)
                ids.append(name)
        if not pictures:
            return None, [], None, None, skipped
        inputs = _image_inputs(PixelInputs(pictures), "add")
        model = self.index.model
        with encoding(model, self.compute_dtype):
            embeddings = model.encode_images(inputs, batch_size=self.batch_size).to(torch.float32)
        return embeddings, ids, self.index._stored_boxes(inputs, embeddings), None, skipped


def stage_shard(index: SearchIndex, path: Path, embeddings: Embeddings, ids: list[str], boxes: torch.Tensor | None,
                texts: list[str] | None) -> dict[str, Any]:
    """Check a chunk's items as an append does and write them as the shard file ``path`` (the
    tensors :meth:`ShardStore.add` writes); its shard record, ``file`` still to be set.

    Example:
        >>> from xmatch.index.synthetic import scoring_model
        >>> index = xmatch.index.create("idx", scoring_model("MrSw", 16))
        >>> e = xmatch.Embeddings(torch.rand(2, 3, 16), torch.ones(2, 3, dtype=torch.bool))
        >>> record = stage_shard(index, Path("chunk.safetensors"), e, ["a", "b"], None, None)
        >>> record["count"], record["width"]
        (2, 3)
    """
    index._check_new_ids(ids, len(embeddings))
    if embeddings.dim != index.manifest["dim"]:
        raise SearchIndexError(f"the index holds {index.manifest['dim']}-d tokens, the batch has {embeddings.dim}-d.")
    embeddings = embeddings.detach().to("cpu")
    checks.check_finite(embeddings, ids)
    embeddings = embeddings.trimmed()
    if boxes is not None:
        boxes = boxes[:, : embeddings.tokens.shape[1]]
    dtype = index.store.dtype
    return write_shard(path, embeddings, ids, dtype=dtype, boxes=boxes, texts=texts).as_dict()


def _commit(index: SearchIndex, staging: Path, n_chunks: int) -> tuple[int, list[tuple[str, str]]]:
    """Move the staged shards into ``shards/`` and list them all in one manifest write."""
    from filelock import FileLock

    records = [json.loads(_record(staging, j).read_text(encoding="utf-8")) for j in range(n_chunks)]
    plan = json.loads((staging / PLAN).read_text(encoding="utf-8"))
    ids = [i for r in records for i in r["ids"]]
    with FileLock(str(index.root / ".lock")):
        index._reload_if_changed()
        if index.manifest.get("generation") != plan["generation"]:
            raise SearchIndexError(
                f"the index {index.root} was changed by another writer while this run encoded; nothing of this run "
                "was committed: run it again (--append), and it encodes again the items the index lacks."
            )
        index._check_new_ids(ids, len(ids))
        folder = own_folder(index.root, SHARDS)
        index.store._remove_uncommitted(folder)
        first = len(index.store.shards)
        new = []
        for record in records:
            if record["shard"] is None:
                continue
            name = f"{first + len(new):08d}.safetensors"
            move_into_place(staging / record["shard"], folder / name)
            new.append(record["info"] | {"file": f"{SHARDS}/{name}"})
        fsync_dir(folder)
        manifest = {**index.manifest, "shards": [*index.manifest.get("shards", []), *new],
                    "items": int(index.manifest.get("items", 0)) + len(ids)}
        write_manifest(index.root, manifest)
        index._reload_if_changed()
    shutil.rmtree(staging)
    return len(ids), [tuple(s) for r in records for s in r["skipped"]]
