"""Where a Qdrant index's points live: the manifest's engine record, made and checked.

The record's ``location`` is either a server URL (``http://host:6333``; the record also names
the ``collection``) or the name of a folder *inside* the index folder holding the embedded
Qdrant Edge shard (default ``qdrant``). A name, never a path: a copied index folder uses its own
copy of the shard, and nothing a manifest says can make xmatch open or write files outside the
index. Manifests written before Qdrant Edge recorded an absolute path to a folder of
qdrant-client's local mode, which persists points with pickle; they are refused, never opened.

Example:
    >>> engine_record(Path("idx"), None, None)
    {'location': 'qdrant'}
    >>> engine_record(Path("idx"), "http://db:6333", None)
    {'location': 'http://db:6333', 'collection': 'xmatch-idx'}
    >>> engine_problem({"location": "qdrant"}) is None, engine_problem({"location": "../elsewhere"}) is None
    (True, False)

The embedded shard is opened by one process at a time. xmatch takes its own lock
(:data:`LOCK_FILE` in the shard's folder) *before* Qdrant Edge reads a byte of the shard:
Edge's own lock (on its write-ahead log) comes after it has loaded the segments, and loading
replays and deletes their tracker journals, so a refused second opener used to break the
holder's next flush. The same lock keeps ``xmatch index --overwrite`` and
:func:`xmatch.index.store.remove_index` from deleting a shard another process has open.
"""

from __future__ import annotations

import io
import os
import re
import socket
from pathlib import Path
from typing import Any

from xmatch.index.errors import SearchIndexError

#: the embedded shard's folder in a new index
DEFAULT_FOLDER = "qdrant"
#: a folder name inside the index: one path component, no leading dot (so neither ``.`` nor ``..``)
FOLDER_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")
#: what the index folder itself holds (xmatch.index.store, .ranking, .search): not for the shard
RESERVED = ("index.json", "index.json.partial", "shards", "ann", "model")
#: the file in the shard's folder that the process holding the shard keeps locked (it names the holder)
LOCK_FILE = "xmatch.lock"


def is_url(location: str) -> bool:
    """Whether an engine location names a Qdrant server (else an embedded shard's folder)."""
    return location.startswith(("http://", "https://"))


def engine_record(root: Path, location: str | None, collection: str | None) -> dict[str, Any]:
    """The engine entry of a new Qdrant index at ``root``.

    Args:
        root: the index folder.
        location: a server URL, or the name of the embedded shard's folder inside ``root``
            (an absolute path inside ``root`` is turned into its name); default ``qdrant``.
        collection: the server's collection (default ``xmatch-<folder name>``); the embedded
            shard is a collection of its own and takes none.

    Raises:
        ValueError: a local location outside the index folder, or a collection for the
            embedded engine.
    """
    if location is not None and is_url(location):
        return {"location": location, "collection": collection or f"xmatch-{root.resolve().name}"}
    if collection is not None:
        raise ValueError(f"a collection name ({collection!r}) applies to a Qdrant server; the embedded engine keeps "
                         "one shard inside the index folder. Give a server URL with it, or leave it out.")
    name = location or DEFAULT_FOLDER
    path = Path(name)
    if path.is_absolute() and path.resolve().parent == root.resolve():
        name = path.name
    problem = engine_problem({"location": name})
    if problem:
        raise ValueError(f"{problem}.")
    return {"location": name}


def engine_problem(engine: dict[str, Any]) -> str | None:
    """What is wrong with a Qdrant index's engine entry, or None (the manifest alone: whether
    the folder is a real folder inside the index is checked when the shard is opened)."""
    location = engine.get("location")
    if not isinstance(location, str):
        return "a Qdrant index must record its location (a server URL or a folder name inside the index)"
    if is_url(location):
        if not isinstance(engine.get("collection"), str) or not engine["collection"]:
            return f"a Qdrant index on the server {location} must record its collection"
        return None
    if Path(location).is_absolute():
        return (f"the Qdrant location {location!r} is an absolute path: an index made before xmatch used Qdrant Edge "
                "keeps its points in qdrant-client's local mode, which stores them with pickle, so opening them could "
                "run code planted in that folder. xmatch no longer opens such storage, and `xmatch index --from-index` "
                "cannot read it safely either: rebuild the index from its images or captions (xmatch index MODEL "
                "--engine qdrant --out NEW_INDEX)")
    if not FOLDER_NAME.fullmatch(location) or location in RESERVED:
        return (f"the Qdrant location {location!r} is not a folder name inside the index (letters, digits, '_', '-', "
                f"'.'; not {', '.join(RESERVED)}) nor a server URL")
    return None


class ShardLock:
    """The exclusive lock of an embedded shard's folder, held by this process until
    :meth:`release` (or until the object is collected, which closes its descriptor).

    Example:
        >>> folder = Path("idx-lock") / "qdrant"
        >>> folder.mkdir(parents=True)
        >>> held = ShardLock(folder)
        >>> ShardLock(folder)  # a second holder, in this process or another, is refused
        Traceback (most recent call last):
        ...
        xmatch.index.errors.SearchIndexError: the Qdrant shard idx-lock/qdrant is open in another process or index object (process ... on ...); close that one (index.close()) first.
        >>> held.release()
        >>> ShardLock(folder).release()
    """

    def __init__(self, folder: Path) -> None:
        import fcntl

        self.folder = folder
        self._file: io.FileIO | None = None
        # O_NOFOLLOW: a lock file planted as a link is not followed out of the index
        try:
            fd = os.open(folder / LOCK_FILE, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o644)
        except OSError as exc:
            raise SearchIndexError(f"the Qdrant shard {folder} cannot be locked ({exc.strerror}: {folder / LOCK_FILE}); "
                                   "Qdrant Edge writes in its shard even to search, so the index folder must be "
                                   "writable (copy a read-only index to a writable disk first: cp -r --sparse=always).") from None
        self._file = io.FileIO(fd, "r+")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = self._file.read(200).decode("utf-8", "replace").strip() or "a process that did not say which"
            self.release()
            raise SearchIndexError(f"the Qdrant shard {folder} is open in another process or index object ({holder}); "
                                   "close that one (index.close()) first.") from None
        except BaseException:
            self.release()
            raise
        self._file.truncate(0)
        self._file.write(f"process {os.getpid()} on {socket.gethostname()}".encode())
        self._file.flush()

    def release(self) -> None:
        """Let another process open the shard (closing the descriptor releases the lock)."""
        if self._file is not None:
            self._file.close()
            self._file = None

    def __del__(self) -> None:
        self.release()


def claim_for_removal(root: Path) -> ShardLock | None:
    """The lock of the index's default embedded shard (``root/qdrant``), taken before anything of
    the index is removed, so that an index whose shard another process has open is refused
    whole rather than left without its manifest; None where there is no such folder.

    Raises:
        SearchIndexError: the shard is open in another process (named), with what to do.
    """
    folder = root / DEFAULT_FOLDER
    if folder.is_symlink() or not folder.is_dir():
        return None
    try:
        return ShardLock(folder)
    except SearchIndexError as exc:
        raise SearchIndexError(f"{exc} The index {root} is not removed while its shard is open: close the index "
                               "there, then run this again.") from None
