"""The documented limit of the cache's once-per-process check (docs/weights.md, "The cache"):
inside one process, a cached file changed in place with its size and mtime put back is not
checked again; the next process checks it. This test keeps the documentation and the
behaviour together: if the shortcut changes, the page must change with it."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from xmatch.io import hub

DOCS = Path(__file__).resolve().parents[1] / "docs" / "weights.md"


def test_a_file_changed_with_its_size_and_mtime_restored_is_checked_by_the_next_process(tmp_path, monkeypatch):
    monkeypatch.setenv("XMATCH_HOME", str(tmp_path))
    monkeypatch.setenv("XMATCH_OFFLINE", "1")  # the cached copy only: nothing is downloaded
    monkeypatch.setattr(hub, "_DIGESTS", {})
    body = bytes(range(256)) * 64
    source = {"source": "https://example.invalid/w/model.safetensors", "sha256": hashlib.sha256(body).hexdigest(),
              "size": len(body)}
    path = hub.cache_dir() / "weights" / source["sha256"] / "model.safetensors"
    path.parent.mkdir(parents=True)
    path.write_bytes(body)
    assert hub.fetch(source, progress=False) == path  # checked once: size and sha256
    before = path.stat()
    with open(path, "r+b") as f:  # one byte changed in place: same inode, same size
        f.seek(100)
        f.write(b"\xff")
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))  # and the modification time put back
    assert hub.fetch(source, progress=False) == path, "this process remembers the file as checked"
    monkeypatch.setattr(hub, "_DIGESTS", {})  # the next process
    with pytest.raises(hub.CorruptCacheError, match="corrupted"):
        hub.fetch(source, progress=False)
    page = " ".join(DOCS.read_text(encoding="utf-8").split())
    assert "modification time (mtime) put back is not checked again; the next process checks it" in page
    assert "tests/test_hub_recheck_limit.py" in page
