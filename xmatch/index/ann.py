"""Approximate nearest-neighbour search by inner product, through FAISS (``faiss-cpu``).

One :class:`VectorIndex` holds float32 vectors with int64 ids: an exact ``flat`` scan while a
scan stays in the milliseconds, then ``hnsw`` (a graph over the vectors) for one vector per
item (:func:`choose_kind`). Token vectors beyond the flat limit go to centroid lists instead
(:mod:`xmatch.index.centroids`). FAISS is imported on first use.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from xmatch.index.errors import DamagedIndexError

KINDS = ("flat", "hnsw")
#: stored token vectors scanned exactly (one matrix product) before centroid lists take over
FLAT_LIMIT = 65_536
#: one vector per item: an exact scan stays fast up to here
PER_ITEM_FLAT_LIMIT = 1_000_000


def faiss() -> Any:
    from xmatch.core.optional import require

    return require("faiss", "xmatch-zoo[index]", "the embedded search index (FAISS)")


def choose_kind(n_vectors: int) -> str:
    """``flat`` (exact) up to :data:`PER_ITEM_FLAT_LIMIT` vectors, ``hnsw`` beyond."""
    return "flat" if n_vectors <= PER_ITEM_FLAT_LIMIT else "hnsw"


class VectorIndex:
    """Inner-product search over vectors with int64 ids.

    Args:
        dim: vector width.
        kind: ``flat`` (exact) or ``hnsw``.

    Example:
        >>> index = VectorIndex(4, "flat")
        >>> index.add(np.eye(4, dtype=np.float32) + 0.1, np.arange(10, 14))
        >>> index.search(np.eye(4, dtype=np.float32)[:1], 2)  # (scores, ids) of the 2 best per query
        (array([[1.1, 0.1]], dtype=float32), array([[10, 11]]))
    """

    def __init__(self, dim: int, kind: str, *, raw: Any = None) -> None:
        if kind not in KINDS:
            raise ValueError(f"unknown vector index kind {kind!r}; kinds: {', '.join(KINDS)}.")
        self.dim, self.kind = dim, kind
        self.index = raw if raw is not None else self._new()

    def _new(self) -> Any:
        f = faiss()
        if self.kind == "flat":
            return f.IndexIDMap2(f.IndexFlatIP(self.dim))
        index = f.IndexHNSWFlat(self.dim, 32, f.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = 80
        return f.IndexIDMap2(index)

    @property
    def ntotal(self) -> int:
        return int(self.index.ntotal)

    def add(self, vectors: np.ndarray, ids: np.ndarray) -> None:
        self.index.add_with_ids(np.ascontiguousarray(vectors, dtype=np.float32), np.ascontiguousarray(ids, dtype=np.int64))

    def search(self, queries: np.ndarray, k: int, ef: int = 128) -> tuple[np.ndarray, np.ndarray]:
        """``(similarities [Q, k], ids [Q, k])``; missing neighbours have id -1."""
        params = faiss().SearchParametersHNSW(efSearch=max(ef, k)) if self.kind == "hnsw" else None
        k = max(1, min(k, max(self.ntotal, 1)))
        return self.index.search(np.ascontiguousarray(queries, dtype=np.float32), k, params=params)

    def save(self, path: Path, meta: dict[str, Any]) -> None:
        """Write the index and its record atomically (``path`` and ``path.json``)."""
        f = faiss()
        tmp = path.with_name(path.name + ".partial")
        f.write_index(self.index, str(tmp))
        os.replace(tmp, path)
        record = path.with_name(path.name + ".json")
        tmp = record.with_name(record.name + ".partial")
        tmp.write_text(json.dumps(meta | {"kind": self.kind, "dim": self.dim, "ntotal": self.ntotal}), encoding="utf-8")
        os.replace(tmp, record)

    @classmethod
    def load(cls, path: Path) -> tuple[VectorIndex, dict[str, Any]] | None:
        """The index saved at ``path`` with its record, or None when there is none yet.

        Raises:
            DamagedIndexError: the files exist but do not agree or cannot be read.
        """
        record = path.with_name(path.name + ".json")
        if not path.is_file() or not record.is_file():
            return None
        try:
            meta = json.loads(record.read_text(encoding="utf-8"))
            raw = faiss().read_index(str(path))
        except (OSError, ValueError, RuntimeError) as exc:
            raise DamagedIndexError(
                f"stage-1 index {path} is unreadable ({exc}); delete it and it is rebuilt from the shards."
            ) from None
        if int(raw.ntotal) != int(meta.get("ntotal", -1)):
            raise DamagedIndexError(
                f"stage-1 index {path} holds {raw.ntotal} vectors where its record says {meta.get('ntotal')}; "
                "delete it and it is rebuilt from the shards."
            )
        return cls(int(meta["dim"]), meta["kind"], raw=raw), meta
