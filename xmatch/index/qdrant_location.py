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
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

#: the embedded shard's folder in a new index
DEFAULT_FOLDER = "qdrant"
#: a folder name inside the index: one path component, no leading dot (so neither ``.`` nor ``..``)
FOLDER_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")
#: what the index folder itself holds (xmatch.index.store, .ranking, .search): not for the shard
RESERVED = ("index.json", "index.json.partial", "shards", "ann", "model")


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
