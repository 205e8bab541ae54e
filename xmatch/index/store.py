"""The index folder: a manifest (``index.json``) and the corpus token sets in shard files.

Layout::

    INDEX/
      index.json              what the index holds: side, model fingerprint and spec, engine,
                              the list of complete shards (the commit record), and where
                              known the folder the pictures were read from (``pictures``)
      shards/00000000.safetensors ...   one per appended batch (see xmatch.index.shards)
      ann/                    stage-1 structures (FAISS files), derived from the shards

An append writes its shard file first, then replaces ``index.json`` atomically; the manifest
is the commit point. Every manifest written (a commit of any engine, the creation that an
overwrite ends with) carries a new ``generation`` id, written first in the file: an open index
compares it before each search and reloads on any change (:func:`manifest_signature`). A crash or kill at any moment leaves the previous manifest, which lists
only complete shards: the index reopens at its last complete append, and a half-written shard
(``*.partial``) or an uncommitted one is removed by the next append. Writers take a file lock;
readers need none.
"""

from __future__ import annotations

import json
import os
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from xmatch.model.embeddings import Embeddings
from xmatch.index import qdrant_location
from xmatch.index.checks import non_finite_items
from xmatch.index.errors import DamagedIndexError, SearchIndexError
from xmatch.index.shards import STORED_DTYPES, Shard, ShardInfo, fsync_dir, write_shard

MANIFEST = "index.json"
FORMAT = "xmatch.index/1"
SIDES = ("images", "texts")
SHARDS = "shards"
#: how a manifest names a shard: a file in ``shards/`` (never a path elsewhere)
SHARD_FILE = re.compile(r"shards/[0-9]{8,}\.safetensors")
#: the names this store gives shard files (a ``.partial`` one is a write in progress)
OWN_SHARD_FILE = re.compile(r"[0-9]{8,}\.safetensors(\.partial)?")
#: the record of each shard in the manifest, and what each entry is
SHARD_RECORD = {"file": str, "count": int, "width": int, "bytes": int, "sha256": str}
#: the manifest's optional record of the folder the stored pictures were read from: ``{"root": absolute path}``
PICTURES = "pictures"


#: how many bytes of the manifest :func:`manifest_signature` reads: the generation id is in them
SIGNATURE_BYTES = 128


def write_manifest(root: Path, manifest: dict[str, Any]) -> None:
    """Replace ``root/index.json`` atomically (temporary file, fsync, rename, fsync folder),
    under a new ``generation`` id (set in ``manifest`` too, so the writer's own view is the
    committed one).

    Example:
        >>> Path("idx").mkdir(); manifest = {"format": FORMAT}
        >>> write_manifest(Path("idx"), manifest); first = manifest["generation"]
        >>> write_manifest(Path("idx"), manifest); manifest["generation"] != first
        True
        >>> json.loads(Path("idx/index.json").read_text())["generation"] == manifest["generation"]
        True
    """
    manifest["generation"] = uuid.uuid4().hex
    tmp = root / (MANIFEST + ".partial")
    with open(tmp, "w", encoding="utf-8") as f:
        # the generation first: manifest_signature reads it from the file's first bytes
        json.dump({"generation": manifest["generation"]} | manifest, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, root / MANIFEST)
    fsync_dir(root)


def manifest_signature(root: Path) -> tuple[int, int, int, bytes]:
    """What identifies the committed state of the index at ``root`` without parsing its
    manifest: the file's inode, modification time and size, and its first bytes, which hold the
    generation id (a new one per commit, so two commits never share a signature, even within
    the file system's timestamp resolution and with the inode number reused).

    Raises:
        FileNotFoundError: there is no manifest.
    """
    with open(root / MANIFEST, "rb") as f:
        stat = os.fstat(f.fileno())
        return stat.st_ino, stat.st_mtime_ns, stat.st_size, f.read(SIGNATURE_BYTES)


def read_manifest(root: Path) -> dict[str, Any]:
    """The manifest of the index at ``root``, checked: the format, what the index holds (side,
    width, stored dtype, model, engine) and every shard record (a file in ``shards/``, its
    count, width, size and sha256), the counts adding up to ``items``.

    Raises:
        FileNotFoundError: no index there.
        DamagedIndexError: the manifest is unreadable, of another format, or an entry is
            missing or wrong (named).
    """
    path = root / MANIFEST
    if not path.is_file():
        hint = " (it holds files, but no index.json)" if root.is_dir() and any(root.iterdir()) else ""
        raise FileNotFoundError(
            f"no search index at {root}{hint}; create one with `xmatch index MODEL --out {root}` "
            "or xmatch.index.create(...)."
        )
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as exc:
        raise DamagedIndexError(f"{path} is unreadable ({exc}): the index manifest is damaged.") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise DamagedIndexError(f"{path} is not an xmatch index manifest (format {FORMAT!r} expected).")
    engine = manifest.get("engine")
    if isinstance(engine, dict) and engine.get("name") == "qdrant" and isinstance(engine.get("location"), str) \
            and Path(engine["location"]).is_absolute():
        # not damaged: made before Qdrant Edge; the message says why it is not opened and what to do
        raise SearchIndexError(f"{path}: {qdrant_location.engine_problem(engine)}.")
    problem = _manifest_problem(manifest)
    if problem:
        raise DamagedIndexError(
            f"{path}: {problem}; the index manifest is damaged. Restore it from a copy, or rebuild the index "
            "(xmatch index ... --out NEW_INDEX)."
        )
    return manifest


def _manifest_problem(manifest: dict[str, Any]) -> str | None:
    """What is wrong with a manifest's entries, or None."""
    generation = manifest.get("generation")  # absent from manifests written before it was recorded
    if generation is not None and not (isinstance(generation, str) and re.fullmatch(r"[0-9a-f]{32}", generation)):
        return f"'generation' is {str(generation)[:40]!r}, not the 32 hex digits of a generation id"
    pictures = manifest.get(PICTURES)  # absent where the folder is not known, and from indexes made before it was
    if pictures is not None and not (isinstance(pictures, dict) and isinstance(pictures.get("root"), str)
                                     and os.path.isabs(pictures["root"])):
        return f"'{PICTURES}' must be {{\"root\": the absolute path of the picture folder}}, not {str(pictures)[:60]!r}"
    if manifest.get("side") not in SIDES:
        return f"'side' is {manifest.get('side')!r}, not one of {', '.join(SIDES)}"
    if not _count(manifest.get("dim")) or manifest["dim"] == 0:
        return f"'dim' is {manifest.get('dim')!r}, not a positive width"
    if not isinstance(manifest.get("dtype"), str) or manifest["dtype"] not in STORED_DTYPES:
        return f"'dtype' is {manifest.get('dtype')!r}, not one of {', '.join(STORED_DTYPES)}"
    model = manifest.get("model")
    if not isinstance(model, dict) or not isinstance(model.get("fingerprint"), str) or not (
            model.get("ref") is None or isinstance(model.get("ref"), str)):
        return "'model' must record the model's fingerprint and reference"
    engine = manifest.get("engine")
    if not isinstance(engine, dict) or engine.get("name") not in ("faiss", "qdrant"):
        return "'engine' must name the engine, faiss or qdrant"
    if engine["name"] == "qdrant" and qdrant_location.engine_problem(engine):
        return qdrant_location.engine_problem(engine)
    shards = manifest.get("shards")
    if not isinstance(shards, list) or not _count(manifest.get("items")):
        return "'shards' must list the shard records and 'items' count them"
    for k, record in enumerate(shards):
        if not isinstance(record, dict) or set(record) != set(SHARD_RECORD) or not all(
                isinstance(record[key], kind) and (kind is not int or _count(record[key]))
                for key, kind in SHARD_RECORD.items()):
            return f"shard record {k} is not {{{', '.join(SHARD_RECORD)}}}"
        if not SHARD_FILE.fullmatch(record["file"]):
            return f"shard record {k} names the file {record['file']!r}, not a file in {SHARDS}/"
    if engine["name"] == "faiss" and sum(r["count"] for r in shards) != manifest["items"]:
        return f"its shards hold {sum(r['count'] for r in shards)} items where 'items' says {manifest['items']}"
    return None


def _count(value: Any) -> bool:
    """Whether ``value`` is a non-negative JSON integer (not a bool)."""
    return type(value) is int and value >= 0


class ShardStore:
    """The corpus token sets of an index, kept in memory-mapped shard files.

    Rows are numbered in append order across shards. The shards are memory-mapped, or read
    into memory with ``in_memory=True`` (steady latency where the system reclaims cold pages). ``gather(rows)`` returns the token sets
    of any rows as float32 ``Embeddings``; ``blocks()`` walks the whole corpus shard by shard.

    Example:
        >>> index = xmatch.index.create("idx", xmatch.build("teran-mrsw-scenes", pretrained=True), model_ref="teran-mrsw-scenes")
        >>> index.add(xmatch.RegionInputs(torch.rand(6, 36, 1280), torch.tensor([0.1, 0.1, 0.5, 0.5]).expand(6, 36, 4)))
        6
        >>> store = ShardStore(Path("idx"), read_manifest(Path("idx")))
        >>> store.gather(torch.tensor([0, 5])).tokens.shape  # the 36 regions' tokens of rows 0 and 5
        torch.Size([2, 36, 256])
    """

    def __init__(self, root: Path, manifest: dict[str, Any], in_memory: bool = False) -> None:
        self.root = root
        self.manifest = manifest
        self.in_memory = in_memory
        self.shards = [Shard(_inside(root, s["file"]), ShardInfo(**s), in_memory) for s in manifest.get("shards", [])]
        counts = torch.tensor([0] + [len(s) for s in self.shards], dtype=torch.long)
        self.starts = counts.cumsum(0)
        self._row_of: dict[str, int] | None = None
        self._lengths: list[torch.Tensor] = []

    #: :meth:`verify` checks the stored values too (SearchIndex.verify does not walk them again)
    checks_values = True

    def follow(self, manifest: dict[str, Any]) -> bool:
        """Take in ``manifest``, committed since this store was opened, where it only appends
        (its shard records begin with this store's, the rest of it unchanged): open the new
        shards alone and return True. Otherwise (an overwrite, another layout) change nothing
        and return False: the caller opens a new store.

        Raises:
            DamagedIndexError: a new shard is missing or damaged (this store is left as it was).
        """
        old, new = self.manifest.get("shards", []), manifest.get("shards", [])
        layout = ("format", "side", "dim", "dtype", "model", "engine")
        if any(manifest.get(key) != self.manifest.get(key) for key in layout) or new[: len(old)] != old:
            return False
        added = [Shard(_inside(self.root, s["file"]), ShardInfo(**s), self.in_memory) for s in new[len(old) :]]
        counts = torch.tensor([len(s) for s in added], dtype=torch.long)
        first = len(self)
        self.shards += added
        self.starts = torch.cat([self.starts, self.starts[-1] + counts.cumsum(0)])
        self.manifest = manifest
        if self._row_of is not None:
            self._row_of.update({item: first + k for k, item in enumerate(i for s in added for i in s.ids)})
        return True

    @property
    def dtype(self) -> torch.dtype:
        return STORED_DTYPES[self.manifest["dtype"]]

    def __len__(self) -> int:
        return int(self.starts[-1])

    @property
    def ids(self) -> list[str]:
        return [i for s in self.shards for i in s.ids]

    def ids_of(self, rows: list[int]) -> list[str]:
        """The ids of ``rows``."""
        shard, local = self.locate(torch.as_tensor(rows, dtype=torch.long))
        return [self.shards[s].ids[r] for s, r in zip(shard.tolist(), local.tolist())]

    def has_pooled(self) -> bool:
        """Whether the items carry global vectors."""
        return bool(self.shards) and self.shards[0].pooled is not None

    def row_of(self, ids: list[str]) -> list[int]:
        """Rows of the given ids (KeyError naming the first unknown one)."""
        if self._row_of is None:
            self._row_of = {item: row for row, item in enumerate(self.ids)}
        missing = [i for i in ids if i not in self._row_of]
        if missing:
            raise KeyError(f"id {missing[0]!r} is not in the index {self.root} ({len(missing)} unknown ids).")
        return [self._row_of[i] for i in ids]

    def add(
        self,
        embeddings: Embeddings,
        ids: list[str],
        boxes: torch.Tensor | None = None,
        texts: list[str] | None = None,
    ) -> None:
        """Append one batch as a new shard and commit it in the manifest (call under the lock)."""
        folder = own_folder(self.root, SHARDS)
        self._remove_uncommitted(folder)
        name = f"{len(self.shards):08d}.safetensors"
        embeddings = embeddings.trimmed()
        if boxes is not None:
            boxes = boxes[:, : embeddings.tokens.shape[1]]
        info = write_shard(folder / name, embeddings, ids, dtype=self.dtype, boxes=boxes, texts=texts)
        record = info.as_dict() | {"file": f"{SHARDS}/{name}"}
        self.manifest["shards"] = [*self.manifest.get("shards", []), record]
        self.manifest["items"] = len(self) + len(ids)
        write_manifest(self.root, self.manifest)
        self.shards.append(Shard(self.root / record["file"], ShardInfo(**record), self.in_memory))
        self.starts = torch.cat([self.starts, self.starts[-1:] + len(ids)])
        if self._row_of is not None:
            self._row_of.update({item: len(self) - len(ids) + k for k, item in enumerate(ids)})

    def _remove_uncommitted(self, folder: Path) -> None:
        """Shard files a killed append left behind: files named as this store names shards
        (``NNNNNNNN.safetensors``, or its ``.partial``) that the manifest does not list. Any
        other file is the user's and stays; links are never followed nor removed."""
        committed = {Path(s["file"]).name for s in self.manifest.get("shards", [])}
        for path in folder.iterdir():
            if path.name not in committed and OWN_SHARD_FILE.fullmatch(path.name) and not path.is_symlink():
                path.unlink(missing_ok=True)

    def locate(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(shard number, row within the shard) of each global row."""
        shard = torch.searchsorted(self.starts, rows, right=True) - 1
        return shard, rows - self.starts[shard]

    def gather(self, rows: torch.Tensor) -> Embeddings:
        """Float32 token sets of ``rows``, in the order given (padded to the widest shard touched)."""
        rows = torch.as_tensor(rows, dtype=torch.long)
        if len(rows) and (int(rows.min()) < 0 or int(rows.max()) >= len(self)):
            raise IndexError(f"rows out of range for an index of {len(self)} items.")
        shard, local = self.locate(rows)
        order = torch.argsort(shard)
        touched, counts = torch.unique_consecutive(shard[order], return_counts=True)
        parts = []
        for s, picked in zip(touched.tolist(), torch.split(local[order], counts.tolist())):
            parts.append(self.shards[s].embeddings(picked))  # one fancy index per touched shard
        gathered = parts[0] if len(parts) == 1 else _cat(parts)
        back = torch.argsort(order)
        pooled = None if gathered.pooled is None else gathered.pooled.index_select(0, back)
        return Embeddings(gathered.tokens.index_select(0, back), gathered.mask.index_select(0, back), pooled)

    def blocks(self, first: int = 0) -> Iterator[tuple[int, Embeddings]]:
        """``(first row, float32 token sets)`` of every shard from row ``first`` on, in row order."""
        for start, shard in zip(self.starts.tolist(), self.shards):
            if start + len(shard) <= first:
                continue
            e = shard.embeddings()
            if first > start:
                e, start = e[first - start :], first
            yield start, e

    def lengths(self) -> torch.Tensor:
        """Real tokens of every item ``[N]`` (computed once per shard)."""
        if len(self._lengths) != len(self.shards):
            self._lengths += [s.lengths() for s in self.shards[len(self._lengths) :]]
        return torch.cat(self._lengths) if self._lengths else torch.zeros(0, dtype=torch.long)

    def texts(self, rows: list[int]) -> list[str | None]:
        """The caption of each row (None for image indexes)."""
        shard, local = self.locate(torch.as_tensor(rows, dtype=torch.long))
        out = []
        for s, r in zip(shard.tolist(), local.tolist()):
            texts = self.shards[s].texts
            out.append(texts[r] if texts is not None else None)
        return out

    def boxes(self, rows: torch.Tensor) -> torch.Tensor | None:
        """Region boxes ``[n, T, 4]`` of ``rows`` (None unless every shard keeps them: items
        appended as embeddings without boxes have none)."""
        if not self.shards or any(s.boxes is None for s in self.shards):
            return None
        shard, local = self.locate(torch.as_tensor(rows, dtype=torch.long))
        width = max(s.boxes.shape[1] for s in self.shards)
        out = torch.zeros(len(shard), width, 4)
        for k, (s, r) in enumerate(zip(shard.tolist(), local.tolist())):
            b = self.shards[s].boxes[r]
            out[k, : b.shape[0]] = b.float()
        return out

    def verify(self) -> None:
        """Check every shard's sha256 against the manifest and its values for NaN and infinity
        (reads the whole corpus once).

        Raises:
            DamagedIndexError: naming the first shard whose content changed or is not finite.
        """
        from xmatch.io.files import sha256_file

        for shard in self.shards:
            if sha256_file(shard.path) != shard.info.sha256:
                raise DamagedIndexError(shard._damaged("has another sha256 than the manifest records"))
            bad = non_finite_items(shard.tokens, shard.mask, shard.pooled)
            if bool(bad.any()):
                first = int(bad.nonzero()[0])
                raise DamagedIndexError(shard._damaged(
                    f"holds NaN or infinite values in {int(bad.sum())} items (the first: {shard.ids[first]!r})"
                ))


#: the folders an index makes for itself (whole): the model bundle, stage-1 files, Qdrant Edge storage,
#: the shards of a Ray run not yet committed (xmatch.index.ray_build)
OWN_FOLDERS = ("model", "ann", "qdrant", "staging")


def foreign_files(root: Path) -> list[str]:
    """Names in the index folder ``root`` that are not the index's own (sorted)."""
    own = {MANIFEST, MANIFEST + ".partial", ".lock", SHARDS, *OWN_FOLDERS}
    return sorted(p.name for p in root.iterdir() if p.name not in own) if root.is_dir() else []


def remove_index(root: Path) -> None:
    """Delete the index at ``root``: its manifest, lock, shard files and the folders it made
    (:data:`OWN_FOLDERS`); the folder itself when nothing else is left. Other files stay, and
    links are removed as links (never followed).

    Example:
        >>> remove_index(Path("idx"))  # what `xmatch index --overwrite` does first  # doctest: +SKIP
    """
    import shutil

    held = qdrant_location.claim_for_removal(root)  # refused whole while another process has the Edge shard open
    for name in (MANIFEST, MANIFEST + ".partial", ".lock"):
        (root / name).unlink(missing_ok=True)
    for name in OWN_FOLDERS:
        folder = root / name
        if folder.is_symlink():
            folder.unlink()
        elif folder.is_dir():
            shutil.rmtree(folder)
    shards = root / SHARDS
    if shards.is_symlink():
        shards.unlink()
    elif shards.is_dir():
        for path in shards.iterdir():
            if OWN_SHARD_FILE.fullmatch(path.name) and not path.is_symlink():
                path.unlink()
        if not any(shards.iterdir()):
            shards.rmdir()
    if root.is_dir() and not root.is_symlink() and not any(root.iterdir()):
        root.rmdir()
    if held is not None:
        held.release()


def own_folder(root: Path, name: str, *, create: bool = True) -> Path:
    """The index's subfolder ``name``, made if missing (``create``); refused when it is a link or
    resolves out of the index (reading there would read elsewhere; writing would put files, or
    delete them, elsewhere).

    Raises:
        DamagedIndexError: the folder is a symbolic link, or not a folder.
    """
    folder = root / name
    if folder.is_symlink() or os.path.realpath(folder) != os.path.join(os.path.realpath(root), name):
        raise DamagedIndexError(
            f"{folder} is a symbolic link (to {os.path.realpath(folder)}): an index writes only inside its own "
            f"folder. Replace the link by a real folder holding the index's files, or rebuild the index "
            "(xmatch index ... --out NEW_INDEX)."
        )
    if folder.exists() and not folder.is_dir():
        raise DamagedIndexError(f"{folder} is a file where the index keeps a folder; move it away.")
    if create:
        folder.mkdir(exist_ok=True)
    return folder


def _inside(root: Path, file: str) -> Path:
    """A shard's path, refused when it resolves out of the index (a symbolic link leading elsewhere)."""
    path = root / file
    resolved, folder = os.path.realpath(path), os.path.realpath(root)
    if not resolved.startswith(folder + os.sep):
        raise DamagedIndexError(
            f"index shard {path} resolves to {resolved}, outside the index {root} (a symbolic link): an index "
            "reads only its own files. Copy the shard into the index, or rebuild the index (xmatch index ... "
            "--out NEW_INDEX)."
        )
    return path


def _cat(parts: list[Embeddings]) -> Embeddings:
    """Concatenate; shards of one width (the usual case) need no padding copy."""
    if len({p.tokens.shape[1] for p in parts}) == 1:
        pooled = None if parts[0].pooled is None else torch.cat([p.pooled for p in parts])
        return Embeddings(torch.cat([p.tokens for p in parts]), torch.cat([p.mask for p in parts]), pooled)
    return Embeddings.cat(parts)


def check_side(side: str) -> str:
    if side not in SIDES:
        raise SearchIndexError(f"an index holds 'images' or 'texts', not {side!r}.")
    return side
