"""Shard files: one appended batch of token sets, written atomically, read memory-mapped.

A shard is an ordinary ``Embeddings`` safetensors file (``Embeddings.load`` reads it) with
two extra tensors and the item ids in its metadata:

- ``tokens [n, T, D]`` (float16 by default), ``mask [n, T]``, optional ``pooled [n, D]``;
- optional ``boxes [n, T, 4]``: the box of each region token (precomputed-region models);
- metadata ``user``: JSON ``{"ids": [...], "texts": [...]}`` (texts for caption indexes).

Writes go to a ``.partial`` file that is flushed to disk and renamed into place, so a shard
file is complete or absent. Reads map the file (``numpy.memmap``, copy-on-write) and view the
tensors in place: opening an index of any size costs its header reads, and a search touches
only the pages of the items it scores.
"""

from __future__ import annotations

import json
import math
import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from xmatch.io.files import move_into_place
from xmatch.model.embeddings import _FORMAT as EMBEDDINGS_FORMAT
from xmatch.model.embeddings import Embeddings
from xmatch.index.errors import DamagedIndexError

#: safetensors dtype names this reader maps (the ones an index writes)
_NUMPY = {"F16": np.float16, "F32": np.float32, "BOOL": np.bool_, "I64": np.int64}
STORED_DTYPES = {"float16": torch.float16, "float32": torch.float32}


@dataclass(frozen=True)
class ShardInfo:
    """What the manifest records of a shard: its file (relative to the index), item count,
    token width, size in bytes and sha256."""

    file: str
    count: int
    width: int
    bytes: int
    sha256: str

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def fsync_dir(path: Path) -> None:
    """Flush a directory entry (a rename) to disk; a no-op where directories cannot be opened."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_shard(
    path: Path,
    embeddings: Embeddings,
    ids: list[str],
    *,
    dtype: torch.dtype,
    boxes: torch.Tensor | None = None,
    texts: list[str] | None = None,
) -> ShardInfo:
    """Write one shard atomically and return its record (``file`` is ``path.name``)."""
    from safetensors.torch import save_file

    from xmatch.io.files import sha256_file

    tensors = {"tokens": embeddings.tokens.detach().to("cpu", dtype).contiguous(), "mask": embeddings.mask.cpu().contiguous()}
    if embeddings.pooled is not None:
        tensors["pooled"] = embeddings.pooled.detach().to("cpu", dtype).contiguous()
    if boxes is not None:
        tensors["boxes"] = boxes.detach().to("cpu", dtype).contiguous()
    user = {"ids": ids} | ({"texts": texts} if texts is not None else {})
    tmp = path.with_name(path.name + ".partial")
    save_file(tensors, str(tmp), metadata={"format": EMBEDDINGS_FORMAT, "user": json.dumps(user)})
    with open(tmp, "rb+") as f:
        os.fsync(f.fileno())
    move_into_place(tmp, path)
    fsync_dir(path.parent)
    return ShardInfo(path.name, len(ids), embeddings.tokens.shape[1], path.stat().st_size, sha256_file(path))


class Shard:
    """A shard file mapped into memory; ``tokens``, ``mask``, ``pooled``, ``boxes`` are views
    of the file (no copy), ``ids`` and ``texts`` come from its header.

    Raises:
        DamagedIndexError: the file is missing, has another size than the manifest records,
            or its header does not describe a shard of ``info.count`` items.
    """

    def __init__(self, path: Path, info: ShardInfo, in_memory: bool = False) -> None:
        self.path = path
        self.info = info
        if not path.is_file():
            raise DamagedIndexError(self._damaged("is missing"))
        size = path.stat().st_size
        if size != info.bytes:
            raise DamagedIndexError(self._damaged(f"has {size} bytes where the manifest records {info.bytes}"))
        header, start = self._header(size)
        # copy-on-write mapping: writable views, the file untouched; or the whole file read in
        data = np.fromfile(path, dtype=np.uint8) if in_memory else np.memmap(path, dtype=np.uint8, mode="c")
        if not in_memory and hasattr(mmap, "MADV_RANDOM"):
            # a query reads scattered items: read-ahead would pull in megabytes around each one
            data._mmap.madvise(mmap.MADV_RANDOM)
        views: dict[str, torch.Tensor] = {}
        for name, entry in header.items():
            if name == "__metadata__":
                continue
            views[name] = self._view(data, start, name, entry)
        try:
            user = json.loads(header["__metadata__"].get("user", "{}"))
            if not isinstance(user["ids"], list):
                raise TypeError("the ids are not a list")
            self.ids: list[str] = [str(i) for i in user["ids"]]
            self.texts: list[str] | None = user.get("texts")
            self.tokens, self.mask = views["tokens"], views["mask"]
        except (KeyError, TypeError, ValueError, RecursionError) as exc:
            raise DamagedIndexError(self._damaged(f"lacks the tokens, mask or ids of a shard ({exc})")) from None
        self.pooled = views.get("pooled")
        self.boxes = views.get("boxes")
        n = len(self.ids)
        if n != info.count or self.tokens.shape[0] != n or self.mask.shape != self.tokens.shape[:2]:
            raise DamagedIndexError(self._damaged(
                f"holds {self.tokens.shape[0]} token sets and {n} ids where the manifest records {info.count}"
            ))
        problem = self._layout_problem()
        if problem:
            raise DamagedIndexError(self._damaged(problem))

    def _layout_problem(self) -> str | None:
        """What is wrong with the tensors' types and shapes, or None (the counts are checked)."""
        n, width = self.tokens.shape[0], self.info.width
        if self.tokens.ndim != 3 or not self.tokens.is_floating_point() or self.mask.dtype != torch.bool:
            return "does not hold float tokens [n, T, D] and a boolean mask [n, T]"
        if self.tokens.shape[1] != width:
            return f"holds {self.tokens.shape[1]} tokens per item where the manifest records {width}"
        if self.pooled is not None and (not self.pooled.is_floating_point() or self.pooled.shape != (n, self.tokens.shape[2])):
            return f"has pooled vectors of shape {tuple(self.pooled.shape)}, not {(n, self.tokens.shape[2])}"
        if self.boxes is not None and (not self.boxes.is_floating_point() or self.boxes.shape != (n, width, 4)):
            return f"has boxes of shape {tuple(self.boxes.shape)}, not {(n, width, 4)}"
        texts = self.texts
        if texts is not None and (not isinstance(texts, list) or len(texts) != n or not all(isinstance(t, str) for t in texts)):
            return "has texts that are not one caption per item"
        return None

    def _damaged(self, what: str) -> str:
        return (
            f"index shard {self.path} {what}: the file is damaged. Restore it from a copy, or rebuild "
            "the index (xmatch index ... --out NEW_INDEX)."
        )

    def _header(self, size: int) -> tuple[dict[str, Any], int]:
        try:
            with open(self.path, "rb") as f:
                (length,) = struct.unpack("<Q", f.read(8))
                if length > size - 8:
                    raise ValueError(f"header length {length} exceeds the file")
                header = json.loads(f.read(length))
        except (OSError, ValueError, struct.error, RecursionError) as exc:
            raise DamagedIndexError(self._damaged(f"has an unreadable header ({exc})")) from None
        meta = header.get("__metadata__") if isinstance(header, dict) else None
        if not isinstance(meta, dict) or meta.get("format") != EMBEDDINGS_FORMAT:
            raise DamagedIndexError(self._damaged("is not an xmatch embeddings file"))
        return header, 8 + length

    def _view(self, data: np.ndarray, start: int, name: str, entry: dict[str, Any]) -> torch.Tensor:
        try:
            kind = _NUMPY[entry["dtype"]]
            begin, end = (start + _whole(o) for o in entry["data_offsets"])
            shape = tuple(_whole(s) for s in entry["shape"])
            if not start <= begin <= end <= len(data) or end - begin != math.prod(shape) * np.dtype(kind).itemsize:
                raise ValueError(f"tensor {name} does not fit the file")
        except (KeyError, TypeError, ValueError) as exc:
            raise DamagedIndexError(self._damaged(f"has a bad tensor entry {name!r} ({exc})")) from None
        return torch.from_numpy(data[begin:end].view(kind).reshape(shape))

    def __len__(self) -> int:
        return len(self.ids)

    def embeddings(self, rows: torch.Tensor | None = None, dtype: torch.dtype = torch.float32) -> Embeddings:
        """The token sets of ``rows`` (local row numbers; default all) as ``dtype`` copies."""
        # index_select, not t[rows]: advanced indexing of these views is a hundred times slower
        pick = (lambda t: t) if rows is None else (lambda t: t.index_select(0, rows))
        pooled = None if self.pooled is None else pick(self.pooled).to(dtype)
        return Embeddings(pick(self.tokens).to(dtype), pick(self.mask).clone(), pooled)

    def lengths(self) -> torch.Tensor:
        """Real tokens per item ``[n]``."""
        return self.mask.sum(dim=1)


def _whole(value: Any) -> int:
    """A JSON integer >= 0 from a tensor entry (a shape or an offset)."""
    if type(value) is not int or value < 0:
        raise ValueError(f"{value!r} is not a size")
    return value
