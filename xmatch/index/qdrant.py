"""The Qdrant engine: the token sets live in Qdrant as multi-vectors.

Qdrant stores a variable number of vectors per point and scores a multi-vector query by
late interaction (``MultiVectorComparator`` MaxSim on ``Dot``: for each query vector, the best
stored vector, summed). With a caption as the query and an image's regions stored, that is
exactly TERAN's MrSw. Each item is a point ``id = row`` with named vectors ``tokens`` (the real
tokens, no padding) and, when the model has them, ``pooled``; the payload holds the item's id,
row, caption and region boxes. Two places hold the points:

- **Embedded** (default; the manifest's location is a folder *name* such as ``qdrant``): a
  `Qdrant Edge <https://qdrant.tech/documentation/edge/>`_ shard inside the index folder, Qdrant's
  own Rust engine in-process (``qdrant-edge-py``). It persists as a write-ahead log and segment
  files (JSON configuration, memory-mapped float32 vectors; no pickle). xmatch never runs Edge's
  optimizer, so the segments stay plain, and every MaxSim search asks for an exact scan
  (``SearchParams(exact=True)``): stage 1 is exhaustive MaxSim and proves its top-k. The shard
  is locked by the process that opened it, before Edge reads any of it (another process gets a
  clear error naming the holder, and touches nothing). Every failure of Edge (a damaged segment
  file: Edge raises a bare ``Exception``, or panics) is a :class:`DamagedIndexError` naming the
  shard and the fix.
- **Server** (``qdrant=http://host:6333``, through ``qdrant-client``): the collection can be
  sharded and replicated over a cluster; MaxSim candidates come from Qdrant's HNSW graph
  (approximate: no bounds), and stage 2 stays exact (the candidates' token sets are fetched and
  scored by the pooler).

Appends are committed by the index manifest: points of an append that was killed before its
manifest was written (``row >= items``) are invisible to searches and removed by the next append.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from xmatch.index.candidates import Candidates
from xmatch.index.errors import DamagedIndexError, SearchIndexError
from xmatch.index.interaction import Interaction
from xmatch.index.checks import non_finite_items
from xmatch.index.qdrant_location import LOCK_FILE, ShardLock, is_url
from xmatch.index.shards import STORED_DTYPES
from xmatch.index.store import MANIFEST, read_manifest, write_manifest
from xmatch.model.embeddings import Embeddings
from xmatch.model.masks import pad_stack

#: points per upsert request
UPSERT_BATCH = 256
#: rows per retrieve request when listing every id
ID_PAGE = 4096


def edge() -> Any:
    from xmatch.core.optional import require

    return require("qdrant_edge", "xmatch-zoo[index]", "the embedded Qdrant engine (Qdrant Edge)")


def qdrant() -> Any:
    from xmatch.core.optional import require

    return require("qdrant_client", "xmatch-zoo[index]", "the Qdrant server engine")


@dataclass
class Point:
    """One item as either engine stores it: named vectors and payload of point ``row``."""

    row: int
    vectors: dict[str, Any]
    payload: dict[str, Any]


@dataclass
class Record:
    """A point as the embedded engine returns it (what qdrant-client's records hold)."""

    id: int
    vector: dict[str, Any]
    payload: dict[str, Any]


class EdgeShard:
    """The embedded engine: one Qdrant Edge shard in ``INDEX/<name>``, opened by this process
    alone (an example: :class:`QdrantStore`)."""

    #: every search scans the plain segments (never an HNSW graph): its rankings are exact
    exact = True

    def __init__(self, root: Path, name: str) -> None:
        self.folder = root / name
        self.label = str(self.folder)
        _check_inside(root, self.folder)
        self.shard: Any = None
        self.closed = False
        # before Edge reads a byte: loading replays (and deletes) the segments' tracker journals,
        # which a refused second opener did before Edge's own lock stopped it
        self.lock = ShardLock(self.folder) if self.folder.is_dir() else None
        if (self.folder / "edge_config.json").is_file():
            try:
                _check_segment_files(self.folder)
                with _edge_calls(self.folder, "opened"):
                    self.shard = edge().EdgeShard.load(str(self.folder))
            except BaseException:
                self.close()
                raise

    def exists(self) -> bool:
        return self.shard is not None

    @property
    def live(self) -> Any:
        """The open shard (a closed one says so, rather than failing inside Edge)."""
        if self.closed:
            raise SearchIndexError(f"the Qdrant shard {self.folder} was closed (index.close()); open the index again.")
        return self.shard

    def vector_names(self) -> set[str]:
        """The named vectors the shard was made with (from its JSON configuration)."""
        try:
            return set(json.loads((self.folder / "edge_config.json").read_text(encoding="utf-8"))["vectors"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise DamagedIndexError(f"{self.folder / 'edge_config.json'} is unreadable ({exc}); restore the index "
                                    "folder from a copy, or rebuild the index.") from None

    def create(self, dim: int, dtype: str, pooled: bool) -> None:
        """A new shard for ``dim``-wide vectors. Whatever the index's ``dtype``, the shard keeps
        float32 (the values arrive rounded to ``dtype``): a float16 shard rounds each *query* to
        float16 as well, which put its MaxSim up to 1.2e-4 (relative) off the pooler's score,
        past the tolerance of the bounds that prove the top-k."""
        qe = edge()
        datatype = qe.VectorStorageDatatype.Float32
        vectors = {"tokens": qe.EdgeVectorParams(
            size=dim, distance=qe.Distance.Dot, datatype=datatype,
            multivector_config=qe.MultiVectorConfig(qe.MultiVectorComparator.MaxSim))}
        if pooled:
            vectors["pooled"] = qe.EdgeVectorParams(size=dim, distance=qe.Distance.Dot, datatype=datatype)
        if self.lock is None:
            self.folder.mkdir(exist_ok=True)
            _check_inside(self.folder.parent, self.folder)
            self.lock = ShardLock(self.folder)
        with _edge_calls(self.folder, "created"):
            self.shard = qe.EdgeShard.create(str(self.folder), qe.EdgeConfig(vectors=vectors))
            # the committed-rows filter of every search reads this index, not each point's payload
            self.shard.update(qe.UpdateOperation.create_field_index("row", qe.PayloadSchemaType.Integer))
        _check_inside(self.folder.parent, self.folder)

    def _below(self, items: int, at_least: bool = False) -> Any:
        qe = edge()
        bound = qe.RangeFloat(gte=items) if at_least else qe.RangeFloat(lt=items)
        return qe.Filter(must=[qe.FieldCondition(key="row", range=bound)])

    def delete_from(self, row: int) -> None:
        operation = edge().UpdateOperation.delete_points_by_filter(self._below(row, at_least=True))
        with _edge_calls(self.folder, "written"):
            self.live.update(operation)

    def upsert(self, points: list[Point]) -> None:
        qe = edge()
        operation = qe.UpdateOperation.upsert_points([qe.Point(p.row, p.vectors, p.payload) for p in points])
        with _edge_calls(self.folder, "written"):
            self.live.update(operation)

    def flush(self) -> None:
        with _edge_calls(self.folder, "written"):
            self.live.flush()

    def retrieve(self, rows: list[int], payload: bool | list[str], vectors: list[str]) -> dict[int, Any]:
        if not rows:
            return {}
        with _edge_calls(self.folder, "read"):
            found = self.live.retrieve(rows, with_payload=payload, with_vector=vectors or False)
            # Edge converts a record's vectors on each access: read them here, where a failure is named
            records = {int(p.id): Record(int(p.id), p.vector if vectors else {}, p.payload if payload else {})
                       for p in found}
        for record in records.values():
            lacking = [name for name in vectors if name not in (record.vector or {})]
            if lacking:
                raise DamagedIndexError(f"the Qdrant shard {self.folder} lost the {lacking[0]!r} vectors of row "
                                        f"{record.id}; restore the index folder from a copy, or rebuild the index.")
        return records

    def query(self, vectors: list[Any], using: str, limit: int, items: int) -> list[list[tuple[int, float]]]:
        qe = edge()
        exact = qe.SearchParams(exact=True)
        batch = qe.QueryBatchRequest([
            qe.QueryRequest(limit=limit, query=qe.Query.Nearest(v, using=using), filter=self._below(items),
                            params=exact, with_payload=False, with_vector=False) for v in vectors])
        with _edge_calls(self.folder, "searched"):
            return [[(int(p.id), float(p.score)) for p in found] for found in self.live.query_batch(batch)]

    def count(self, items: int) -> int:
        with _edge_calls(self.folder, "read"):
            return int(self.live.count(edge().CountRequest(exact=True, filter=self._below(items))))

    def close(self) -> None:
        try:
            if self.shard is not None:
                with _edge_calls(self.folder, "closed"):
                    self.shard.close()
        finally:
            self.shard, self.closed = None, True
            if self.lock is not None:  # after Edge let go of its files: the next opener may load them
                self.lock.release()
                self.lock = None


def _check_inside(root: Path, folder: Path) -> None:
    """Refuse a shard folder that is, or holds, a symbolic link: Edge would follow it out of the index."""
    if folder.is_symlink() or (folder.exists() and folder.resolve() != root.resolve() / folder.name):
        raise DamagedIndexError(f"{folder} is a link out of the index folder; the index's Qdrant shard must be a "
                                "plain folder inside it. Remove the link and rebuild the index.")
    if folder.is_dir():
        for parent, dirs, files in os.walk(folder):
            for name in dirs + files:
                if os.path.islink(os.path.join(parent, name)):
                    raise DamagedIndexError(
                        f"{os.path.join(parent, name)} is a symbolic link inside the index's Qdrant shard; Qdrant Edge "
                        "would follow it out of the index folder. Remove it and rebuild the index.")


@contextlib.contextmanager
def _edge_calls(folder: Path, done: str) -> Iterator[None]:
    """Every failure inside Edge as a :class:`SearchIndexError` naming the shard: Edge raises a
    bare ``Exception`` for every failure, and a Rust panic arrives as pyo3's ``PanicException``,
    a ``BaseException`` (an interrupt, an exit and a lack of memory pass through as they are)."""
    try:
        yield
    except (SearchIndexError, KeyboardInterrupt, SystemExit, GeneratorExit, MemoryError):
        raise
    except BaseException as exc:  # noqa: BLE001 - see above
        raise _edge_error(folder, exc, done) from None


def _edge_error(folder: Path, exc: BaseException, done: str = "opened") -> SearchIndexError:
    said = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:500]
    if "WouldBlock" in said:
        return SearchIndexError(f"the Qdrant shard {folder} is open in another process or index object ({said}); "
                                "close that one (index.close()) first.")
    return DamagedIndexError(f"the Qdrant shard {folder} cannot be {done}: a file of it is damaged ({said}); restore "
                             "the index folder from a copy, or rebuild the index.")


#: the fixed size of the small state files of Edge's storages: a count (chunked vectors), or a
#: count and a flag (the bit flags of deleted points and of the null index)
_STATUS_BYTES = {"chunks": 8, "flags": 16}


def _check_segment_files(folder: Path) -> None:
    """Refuse, before Edge loads them, segment files whose damage Edge would only meet later (a
    bare error at the first search) or that make it panic: a state file of the wrong size, a
    vector or payload file missing or shorter than the chunk or page Edge preallocates."""
    segments = folder / "segments"
    for segment in sorted(segments.iterdir()) if segments.is_dir() else []:
        if not segment.is_dir():
            continue
        for storage in sorted(segment.glob("vector_storage-*")):
            for part in ("vectors", "deleted", *(["offsets"] if (storage / "offsets").exists() else [])):
                if not (storage / part / "status.dat").is_file():
                    _damaged(storage / part / "status.dat", "is missing")
        for status in sorted(segment.rglob("status.dat")):
            kind = "flags" if (status.parent / "flags_a.dat").exists() else "chunks"
            if status.stat().st_size != _STATUS_BYTES[kind]:
                _damaged(status, f"holds {status.stat().st_size} bytes, not {_STATUS_BYTES[kind]}")
            if kind == "chunks":
                _check_chunks(status.parent)
        _check_id_mappings(segment)
        payload = segment / "payload_storage"
        if payload.is_dir():
            page = _config_number(payload / "config.json", "page_size_bytes")
            for path in sorted(payload.glob("page_*.dat")):
                if path.stat().st_size != page:
                    _damaged(path, f"holds {path.stat().st_size} bytes where Edge writes pages of {page}")


#: the id tracker's log entries: tag -> (bytes after the tag, where the internal id is, or None)
_MAPPING_ENTRIES = {1: (12, 8), 2: (20, 16), 3: (8, None), 4: (16, None)}


def _check_id_mappings(segment: Path) -> None:
    """The id tracker's log (``mutable_id_tracker.mappings``: entries of a tag, the point id and
    the internal id) maps points to internal ids, and Edge sizes a table by the largest: one
    flipped byte in an internal id made it allocate 58 GB (a process abort, not an error).
    Every internal id must be below the vector slots the segment has (with room to spare)."""
    path = segment / "mutable_id_tracker.mappings"
    counts = [int.from_bytes(status.read_bytes()[:8], "little")
              for status in segment.glob("vector_storage-*/*/status.dat") if status.parent.name in ("offsets", "vectors")
              and not (status.parent.name == "vectors" and (status.parent.parent / "offsets").exists())]
    if not path.is_file() or not counts:
        return
    limit = 2 * max(counts) + 65536  # far below what a flipped high byte claims
    data = path.read_bytes()
    at = 0
    while at < len(data) and data[at] in _MAPPING_ENTRIES:
        size, internal = _MAPPING_ENTRIES[data[at]]
        if at + 1 + size > len(data):
            break  # a torn last entry: Edge drops it
        if internal is not None and int.from_bytes(data[at + 1 + internal:at + 1 + size], "little") >= limit:
            _damaged(path, f"maps a point to internal id {int.from_bytes(data[at + 1 + internal:at + 1 + size], 'little')}, "
                     f"past the {max(counts)} vector slots of its segment")
        at += 1 + size


def _check_chunks(part: Path) -> None:
    """The chunk files of one vector storage: as many as its count needs, each of the chunk size."""
    size = _config_number(part / "config.json", "chunk_size_bytes")
    per_chunk = _config_number(part / "config.json", "chunk_size_vectors")
    stored = int.from_bytes((part / "status.dat").read_bytes()[:8], "little")
    for k in range(-(-stored // max(per_chunk, 1))):
        chunk = part / f"chunk_{k}.mmap"
        if not chunk.is_file() or chunk.stat().st_size != size:
            found = f"holds {chunk.stat().st_size} bytes" if chunk.is_file() else "is missing"
            _damaged(chunk, f"{found} where {stored} stored vectors need a chunk of {size} bytes")


def _config_number(path: Path, key: str) -> int:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))[key]
    except (OSError, ValueError, KeyError, TypeError):
        value = None
    if type(value) is not int or value <= 0:
        _damaged(path, f"does not record {key!r}")
    return value


def _damaged(path: Path, problem: str) -> None:
    raise DamagedIndexError(f"{path} {problem}: the index's Qdrant shard is damaged. Restore the index folder from "
                            "a copy, or rebuild the index (xmatch index ... --out NEW_INDEX).")


class Server:
    """The server engine: one collection of a Qdrant server or cluster, through qdrant-client.

    Every request that gets no answer raises a :class:`SearchIndexError` naming the URL.
    """

    #: candidates come from the server's HNSW graph: approximate, never bounds
    exact = False

    def __init__(self, url: str, collection: str) -> None:
        self.label, self.collection = f"{url} (collection {collection!r})", collection
        self.url = url
        # no version check: it would be one more request at every opening, and a warning where
        # the server is down before the error below says so
        self.client = qdrant().QdrantClient(url=url, check_compatibility=False)

    @contextlib.contextmanager
    def _answered(self) -> Iterator[None]:
        from qdrant_client.http.exceptions import ApiException, ResponseHandlingException

        try:
            yield
        except ResponseHandlingException as exc:
            raise SearchIndexError(
                f"the Qdrant server at {self.url} does not answer ({exc.source}); start it, or, if it moved, put its "
                "address in the index's index.json (engine -> location).") from None
        except ApiException as exc:
            raise SearchIndexError(f"the Qdrant server at {self.url} refused a request for the collection "
                                   f"{self.collection!r}: {str(exc).splitlines()[0]}.") from None

    def exists(self) -> bool:
        with self._answered():
            return bool(self.client.collection_exists(self.collection))

    def vector_names(self) -> set[str]:
        """The named vectors of a collection made beforehand (e.g. sharded and replicated by its owner)."""
        with self._answered():
            vectors = self.client.get_collection(self.collection).config.params.vectors
        return set(vectors) if isinstance(vectors, dict) else set()

    def create(self, dim: int, dtype: str, pooled: bool) -> None:
        m = qdrant().models
        datatype = m.Datatype.FLOAT16 if dtype == "float16" else m.Datatype.FLOAT32
        vectors = {"tokens": m.VectorParams(
            size=dim, distance=m.Distance.DOT, datatype=datatype,
            multivector_config=m.MultiVectorConfig(comparator=m.MultiVectorComparator.MAX_SIM),
        )}
        if pooled:
            vectors["pooled"] = m.VectorParams(size=dim, distance=m.Distance.DOT, datatype=datatype)
        with self._answered():
            self.client.create_collection(self.collection, vectors_config=vectors)
            # the committed-rows filter of every search reads this index
            self.client.create_payload_index(self.collection, "row", field_schema=m.PayloadSchemaType.INTEGER)

    def _below(self, items: int, at_least: bool = False) -> Any:
        m = qdrant().models
        bound = m.Range(gte=items) if at_least else m.Range(lt=items)
        return m.Filter(must=[m.FieldCondition(key="row", range=bound)])

    def delete_from(self, row: int) -> None:
        m = qdrant().models
        with self._answered():
            self.client.delete(self.collection, points_selector=m.FilterSelector(filter=self._below(row, True)), wait=True)

    def upsert(self, points: list[Point]) -> None:
        m = qdrant().models
        with self._answered():
            self.client.upsert(self.collection, wait=True,
                               points=[m.PointStruct(id=p.row, vector=p.vectors, payload=p.payload) for p in points])

    def flush(self) -> None:
        """Nothing to do: every upsert waited for the server's acknowledgement."""

    def retrieve(self, rows: list[int], payload: bool | list[str], vectors: list[str]) -> dict[int, Any]:
        with self._answered():
            found = self.client.retrieve(self.collection, ids=rows, with_payload=payload, with_vectors=vectors or False)
        return {int(p.id): p for p in found}

    def query(self, vectors: list[Any], using: str, limit: int, items: int) -> list[list[tuple[int, float]]]:
        m = qdrant().models
        requests = [m.QueryRequest(query=v, using=using, limit=limit, filter=self._below(items), with_payload=False)
                    for v in vectors]
        with self._answered():
            answers = self.client.query_batch_points(self.collection, requests=requests)
        return [[(int(p.id), float(p.score)) for p in a.points] for a in answers]

    def count(self, items: int) -> int:
        with self._answered():
            return int(self.client.count(self.collection, count_filter=self._below(items), exact=True).count)

    def close(self) -> None:
        self.client.close()


class QdrantStore:
    """The corpus of an index kept in Qdrant: an embedded Edge shard or a server collection.

    Example:
        >>> from xmatch.index.synthetic import PlantedCorpus, scoring_model
        >>> index = xmatch.index.create("idx", scoring_model("MrSw", 16), engine="qdrant")
        >>> ids, items = next(PlantedCorpus(images=40, regions=4, dim=16, concepts=8, groups=2).batches())
        >>> index.add(items, ids)
        40
        >>> index.store.engine.folder, index.store.exhaustive  # an Edge shard inside the index, scanned exactly
        (PosixPath('idx/qdrant'), True)
        >>> index.search(items[:1], k=3)[0].exact
        True
        >>> index.close()
    """

    def __init__(self, root: Path, manifest: dict[str, Any]) -> None:
        self.root, self.manifest = root, manifest
        record = manifest["engine"]
        self.location = record["location"]
        self.engine: EdgeShard | Server = (
            Server(self.location, record["collection"]) if is_url(self.location) else EdgeShard(root, self.location))
        self._ids: list[str] | None = None
        self._lengths: torch.Tensor | None = None
        if len(self) and not self.engine.exists():
            self.engine.close()
            raise DamagedIndexError(
                f"the index {root} records {len(self)} items in Qdrant at {self.engine.label}, which holds none; "
                "restore it or rebuild the index.")

    @property
    def exhaustive(self) -> bool:
        """Whether a MaxSim search scans every point (embedded) rather than an HNSW graph (server)."""
        return self.engine.exact

    def __len__(self) -> int:
        return int(self.manifest.get("items", 0))

    def close(self) -> None:
        self.engine.close()

    def has_pooled(self) -> bool:
        return bool(self.manifest["engine"].get("pooled", False))

    def _records(self, rows: list[int], payload: bool | list[str] = True, vectors: list[str] | None = None) -> list[Any]:
        """The points of committed ``rows``, in order."""
        by_row = self.engine.retrieve(rows, payload, vectors or [])
        missing = [r for r in rows if r not in by_row]
        if missing:
            raise DamagedIndexError(f"Qdrant at {self.engine.label} lacks committed rows {missing[:5]} of the index "
                                    f"{self.root}; restore the index folder from a copy, or rebuild the index.")
        return [by_row[r] for r in rows]

    @property
    def ids(self) -> list[str]:
        if self._ids is None or len(self._ids) != len(self):
            self._ids = [self._id(p) for start in range(0, len(self), ID_PAGE)
                         for p in self._records(list(range(start, min(start + ID_PAGE, len(self)))), ["id"])]
        return self._ids

    def ids_of(self, rows: list[int]) -> list[str]:
        return [self._id(p) for p in self._records(rows, ["id"])]

    def _id(self, point: Any) -> str:
        """The item id in a point's payload (a payload without one is damage, named)."""
        item = (point.payload or {}).get("id")
        if not isinstance(item, str):
            raise DamagedIndexError(f"the point of row {point.id} in Qdrant at {self.engine.label} has no item id in "
                                    f"its payload; restore the index folder {self.root} from a copy, or rebuild it.")
        return item

    def lengths(self) -> torch.Tensor | None:
        """Real tokens of every item ``[N]``, from the points' payload (read once, then kept);
        None for points written without the count (a collection filled by an older xmatch)."""
        if self._lengths is None or len(self._lengths) != len(self):
            counts = [p.payload.get("tokens") for start in range(0, len(self), ID_PAGE)
                      for p in self._records(list(range(start, min(start + ID_PAGE, len(self)))), ["tokens"])]
            if any(not isinstance(c, int) for c in counts):
                return None
            self._lengths = torch.tensor(counts, dtype=torch.long)
        return self._lengths

    def texts(self, rows: list[int]) -> list[str | None]:
        return [p.payload.get("text") for p in self._records(rows, ["text"])]

    def row_of(self, ids: list[str]) -> list[int]:
        rows = {item: row for row, item in enumerate(self.ids)}
        missing = [i for i in ids if i not in rows]
        if missing:
            raise KeyError(f"id {missing[0]!r} is not in the index {self.root} ({len(missing)} unknown ids).")
        return [rows[i] for i in ids]

    def add(self, embeddings: Embeddings, ids: list[str], boxes: torch.Tensor | None = None,
            texts: list[str] | None = None) -> None:
        """Upsert one batch as points ``len(self) ...``, flush, then commit it in the manifest."""
        self._ensure_collection(embeddings)
        if self.has_pooled() and embeddings.pooled is None:
            raise SearchIndexError(f"the index {self.root} stores pooled vectors and this batch has none; encode it "
                                   "with the index's model.")
        self.engine.delete_from(len(self))  # the points of an append killed before its commit
        dtype = STORED_DTYPES[self.manifest["dtype"]]
        # the stored precision, as the FAISS engine keeps it: both engines score the same values
        tokens = embeddings.tokens.to(dtype).float()
        pooled = embeddings.pooled.to(dtype).float() if self.has_pooled() else None
        start = len(self)
        for first in range(0, len(ids), UPSERT_BATCH):
            points = []
            for k in range(first, min(first + UPSERT_BATCH, len(ids))):  # Qdrant takes one point object per item
                mask = embeddings.mask[k]
                vectors = {"tokens": tokens[k][mask].tolist()}
                if pooled is not None:
                    vectors["pooled"] = pooled[k].tolist()
                payload = {"id": ids[k], "row": start + k, "tokens": int(mask.sum())}
                payload |= {"text": texts[k]} if texts is not None else {}
                if boxes is not None:
                    payload["boxes"] = boxes[k][mask].tolist()
                points.append(Point(start + k, vectors, payload))
            self.engine.upsert(points)
        self.engine.flush()  # the points are on disk before the manifest says they are there
        self.manifest["items"] = start + len(ids)
        write_manifest(self.root, self.manifest)
        if self._ids is not None:
            self._ids.extend(ids)
        if self._lengths is not None:
            self._lengths = torch.cat([self._lengths, embeddings.mask.sum(dim=1).long()])

    def _ensure_collection(self, embeddings: Embeddings) -> None:
        record = self.manifest["engine"]
        if self.engine.exists():
            if "pooled" not in record:  # a server collection made beforehand (sharded, replicated) by its owner
                record["pooled"] = "pooled" in self.engine.vector_names()
                write_manifest(self.root, self.manifest)
            return
        if "pooled" not in record:  # recorded first: a shard made after a crash here gets the same vectors
            record["pooled"] = embeddings.pooled is not None
            write_manifest(self.root, self.manifest)
        self.engine.create(embeddings.dim, self.manifest["dtype"], self.has_pooled())

    def boxes(self, rows: torch.Tensor) -> torch.Tensor | None:
        """Region boxes ``[n, T, 4]`` of ``rows`` from the payload (None when not kept)."""
        payloads = [p.payload for p in self._records(torch.as_tensor(rows, dtype=torch.long).tolist(), ["boxes"])]
        if not payloads or any("boxes" not in p for p in payloads):
            return None
        return pad_stack([torch.tensor(p["boxes"], dtype=torch.float32) for p in payloads])[0]

    def gather(self, rows: torch.Tensor) -> Embeddings:
        """Float32 token sets of ``rows`` fetched from Qdrant, in the order given."""
        names = ["tokens", "pooled"] if self.has_pooled() else ["tokens"]
        points = self._records(torch.as_tensor(rows, dtype=torch.long).tolist(), False, names)
        vectors = [p.vector for p in points]  # Edge converts a point's vectors on every access: once
        tokens, mask = pad_stack([torch.as_tensor(np.asarray(v["tokens"], dtype=np.float32)) for v in vectors])
        pooled = None
        if self.has_pooled():
            pooled = torch.as_tensor(np.asarray([v["pooled"] for v in vectors], dtype=np.float32))
        return Embeddings(tokens, mask, pooled)

    def blocks(self, first: int = 0, size: int = 1024) -> Iterator[tuple[int, Embeddings]]:
        for start in range(first, len(self), size):
            yield start, self.gather(torch.arange(start, min(start + size, len(self))))

    def verify(self) -> None:
        """Check that Qdrant holds every committed row, and that every stored value is finite
        (reads every point's vectors once).

        Raises:
            DamagedIndexError: rows are missing, or hold NaN or infinite values (naming the
                shard or collection, the first such item and the fix).
        """
        count = self.engine.count(len(self)) if self.engine.exists() else 0
        if count != len(self):
            raise DamagedIndexError(f"Qdrant at {self.engine.label} holds {count} of the {len(self)} committed items "
                                    f"of the index {self.root}; restore the index folder from a copy, or rebuild it.")
        bad, first = 0, None
        for start, block in self.blocks():
            rows = non_finite_items(block.tokens, block.mask, block.pooled)
            if first is None and bool(rows.any()):
                first = self.ids_of([start + int(rows.nonzero()[0])])[0]
            bad += int(rows.sum())
        if first is not None:
            raise DamagedIndexError(
                f"Qdrant at {self.engine.label} holds NaN or infinite values in {bad} items of the index {self.root} "
                f"(the first: {first!r}): its stored vectors are damaged. Restore the index folder from a copy, or "
                "rebuild the index (xmatch index ... --overwrite).")


class QdrantGenerator:
    """Stage 1 from Qdrant: MaxSim over the stored multi-vectors, or the pooled vectors.

    Qdrant's MaxSim sums over the *query's* tokens, so it is exactly the pooler's score for
    MrSw (MrAvgw up to the query's length) when captions query images, and for MwSr when
    images query captions; on the embedded engine (an exact scan) those rankings are exact and
    bound every other item. Other poolers, and a server's HNSW graph, give candidates only.
    """

    def __init__(self, store: QdrantStore, name: str, interaction: Interaction | None, side: str, *,
                 exact_pooled: bool = False) -> None:
        if name not in ("maxsim", "pooled"):
            raise ValueError(f"unknown stage-1 generator {name!r} for the Qdrant engine; generators: maxsim, pooled.")
        if name == "maxsim" and interaction is None:
            raise ValueError("this pooler reads only global vectors; use stage1='pooled'.")
        self.store, self.name, self.interaction, self.side = store, name, interaction, side
        self.exact_pooled = exact_pooled

    @property
    def _bounded(self) -> bool:
        if not self.store.exhaustive:
            return False
        if self.name == "pooled":
            return self.exact_pooled
        i = self.interaction
        query_sum = i.text_sum if self.side == "images" else i.image_sum
        corpus_sum = i.image_sum if self.side == "images" else i.text_sum
        return i.bounded and query_sum and not corpus_sum and not (i.per_word and self.side == "texts")

    def propose(self, query: Embeddings, n: int) -> Candidates:
        if self.name == "pooled" and (query.pooled is None or not self.store.has_pooled()):
            raise SearchIndexError("stage1='pooled' needs global vectors on both sides; this model has none.")
        if self.name == "pooled":
            vectors = query.pooled.tolist()
        else:
            vectors = [query.tokens[q][query.mask[q]].tolist() for q in range(len(query))]
        answers = self.store.engine.query(vectors, "tokens" if self.name == "maxsim" else "pooled", n, len(self.store))
        rows, bounds, floors = [], [], []
        for q, found in enumerate(answers):
            rows.append(torch.tensor([row for row, _ in found], dtype=torch.long))
            scores = torch.tensor([score for _, score in found])
            if self.name == "maxsim" and self.interaction.per_word:
                scores = scores / float(query.lengths[q])
            bounds.append(scores)
            complete = len(found) < n or n >= len(self.store)
            floors.append(float("-inf") if complete or not len(scores) else float(scores[-1]))
        work = self._work(query)
        if not self._bounded:
            return Candidates(rows, work=work)
        return Candidates(rows, bounds, torch.tensor(floors), work)

    def _work(self, query: Embeddings) -> torch.Tensor | None:
        """Similarities per query of the embedded engine's exact scan: the query's tokens times
        every stored token (MaxSim), or one per item (pooled); None for a server's HNSW graph,
        whose visits Qdrant does not report."""
        if not self.store.exhaustive:
            return None
        if self.name == "pooled":
            return torch.full((len(query),), len(self.store), dtype=torch.long)
        lengths = self.store.lengths()
        return None if lengths is None else query.lengths.long() * int(lengths.sum())


#: bytes copied at once by :func:`copy_index_folder`
COPY_BLOCK = 1 << 20


def copy_index_folder(source: str | os.PathLike, target: str | os.PathLike) -> int:
    """Copy the index folder ``source`` to the new folder ``target`` at its real size.

    Qdrant Edge preallocates its files in whole chunks and pages (32 MiB each) and writes
    only what it stores, so a shard of a few hundred kilobytes on disk has hundreds of
    megabytes of *apparent* size, which a copy that does not look for holes
    (``shutil.copytree``, ``tar`` without ``-S``, ``scp``) writes out in full. This copy writes only the data (the
    holes stay holes) and keeps every file's apparent size, which Edge checks. It holds the
    index's writer lock (no append commits meanwhile) and its Edge shard's lock (no process
    has the shard open), so the copy is of one committed state.

    Args:
        source: an index folder.
        target: a folder that does not exist yet, or is empty.

    Returns:
        The bytes the copy allocates on disk (as ``du`` counts them).

    Raises:
        FileNotFoundError: no index at ``source``.
        SearchIndexError: ``target`` holds files, the source's shard is open in another
            process (named), or the source holds a symbolic link.

    Example:
        >>> from xmatch.index.synthetic import PlantedCorpus, scoring_model
        >>> index = xmatch.index.create("idx", scoring_model("MrSw", 16), engine="qdrant")
        >>> ids, items = next(PlantedCorpus(images=40, regions=4, dim=16, concepts=8, groups=2).batches())
        >>> index.add(items, ids); index.close()
        40
        >>> copy_index_folder("idx", "idx-copy") < 10 * 2**20  # on disk: not the shard's 200 MB apparent size
        True
        >>> copy = xmatch.index.open("idx-copy")
        >>> len(copy), copy.search(items[:1], k=1)[0].ids == ids[:1]
        (40, True)
        >>> copy.close()
    """
    from filelock import FileLock

    source, target = Path(source), Path(target)
    manifest = read_manifest(source)
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise SearchIndexError(f"{target} exists and is not an empty folder; copy the index {source} to a new folder.")
    engine = manifest["engine"]
    shard = source / engine["location"] if engine["name"] == "qdrant" and not is_url(engine["location"]) else None
    with FileLock(str(source / ".lock")):
        lock = ShardLock(shard) if shard is not None and shard.is_dir() and not shard.is_symlink() else None
        made = not target.exists()
        try:
            allocated = _copy_tree(source, target)
        except BaseException:
            if made:
                import shutil

                shutil.rmtree(target, ignore_errors=True)
            raise
        finally:
            if lock is not None:
                lock.release()
    return allocated


def _copy_tree(source: Path, target: Path) -> int:
    """Copy every folder and file of ``source`` (the manifest last, so a copy cut short is no
    index), sparse; the bytes allocated."""
    target.mkdir(parents=True, exist_ok=True)
    allocated = 0
    for parent, dirs, files in os.walk(source):
        here = Path(parent)
        out = target / here.relative_to(source)
        for name in sorted(dirs + files):
            if (here / name).is_symlink():
                raise SearchIndexError(f"{here / name} is a symbolic link; an index holds none. Remove it, or rebuild the "
                                       f"index {source}.")
        for name in sorted(dirs):
            (out / name).mkdir()
        for name in sorted(files):
            if name in (LOCK_FILE, ".lock") or (here == source and name in (MANIFEST, MANIFEST + ".partial")):
                continue  # the locks are the source's; the manifest goes last
            allocated += _copy_sparse(here / name, out / name)
    allocated += _copy_sparse(source / MANIFEST, target / MANIFEST)
    return allocated


def _copy_sparse(source: Path, target: Path) -> int:
    """Copy one file writing only its data (the extents the file system reports, and within
    them no all-zero block), at its apparent size; the bytes the copy allocates."""
    with open(source, "rb") as fin, open(target, "xb") as fout:
        size = os.fstat(fin.fileno()).st_size
        for start, end in _data_ranges(fin.fileno(), size):
            fin.seek(start)
            while start < end:
                block = fin.read(min(COPY_BLOCK, end - start))
                if not block:
                    break
                for k in range(0, len(block), 4096):  # the file system's page: a zero one stays a hole
                    piece = block[k:k + 4096]
                    if piece.count(0) != len(piece):
                        fout.seek(start + k)
                        fout.write(piece)
                start += len(block)
        fout.truncate(size)
        fout.flush()
        os.fsync(fout.fileno())
        allocated = os.fstat(fout.fileno()).st_blocks * 512
    import shutil

    shutil.copymode(source, target)
    return allocated


def _data_ranges(fd: int, size: int) -> Iterator[tuple[int, int]]:
    """The ``(start, end)`` extents of a file that hold data (the whole file where the system
    does not report holes)."""
    if not hasattr(os, "SEEK_DATA"):
        yield 0, size
        return
    offset = 0
    while offset < size:
        try:
            start = os.lseek(fd, offset, os.SEEK_DATA)
        except OSError as exc:
            if exc.errno != errno.ENXIO and offset == 0:  # the file system reports no holes: all of it
                yield 0, size
            return  # ENXIO: only a hole is left
        end = os.lseek(fd, start, os.SEEK_HOLE)
        yield start, end
        offset = end
