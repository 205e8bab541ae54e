"""Where a Qdrant index's points live: the manifest's engine record, made and checked.

The record names the collection and its location: a server URL, or a folder of the embedded
engine.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def engine_record(root: Path, location: str | None, collection: str | None) -> dict[str, Any]:
    """The engine entry of a new Qdrant index at ``root``: its location (default ``INDEX/qdrant``)
    and collection (default ``xmatch-<folder name>``)."""
    return {"location": location or str((root / "qdrant").resolve()),
            "collection": collection or f"xmatch-{root.resolve().name}"}


def engine_problem(engine: dict[str, Any]) -> str | None:
    """What is wrong with a Qdrant index's engine entry, or None."""
    if not (isinstance(engine.get("location"), str) and isinstance(engine.get("collection"), str)):
        return "a Qdrant index must record its location and collection"
    return None
