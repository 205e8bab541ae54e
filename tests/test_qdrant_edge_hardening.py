"""The embedded Qdrant engine as solid as FAISS: damaged segment files named (never a bare
``Exception``, a ``KeyError`` or a Rust panic), a refused second opener that touches nothing,
no removal under a holder, copies at the real size, stored values checked by ``verify()``."""

from __future__ import annotations

import errno
import hashlib
import json
import math
import os
import random
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import xmatch
import xmatch.index
from xmatch.index import DamagedIndexError, SearchIndexError
from xmatch.index.synthetic import scoring_model

from test_qdrant_edge import DIM, edge_index, ragged

pytest.importorskip("qdrant_edge")

TESTS = os.path.dirname(__file__)


def run(*args: str) -> subprocess.CompletedProcess:
    """A Python process (``-c SCRIPT ARGS`` or ``-m xmatch ARGS``) run to its end, tests importable."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([TESTS, os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True, timeout=300)


def segment(root: Path) -> Path:
    (found,) = (root / "qdrant" / "segments").iterdir()
    return found


def flip(path: Path) -> None:
    """64 bytes of the file's first 4 KiB inverted (the same ones every run)."""
    data = bytearray(path.read_bytes())
    rnd = random.Random(1)
    for _ in range(64):
        k = rnd.randrange(min(len(data), 4096))
        data[k] ^= 0xFF
    path.write_bytes(bytes(data))


def empty(path: Path) -> None:
    path.write_bytes(b"")


#: five kinds of damaged segment file (and some variants): each was a bare Exception, a
#: KeyError or a Rust panic (pyo3's PanicException, a BaseException) at open or at the first search
DAMAGE = {
    "vector-chunk-emptied": ("vector_storage-tokens/vectors/chunk_0.mmap", empty),
    "vector-chunk-deleted": ("vector_storage-pooled/vectors/chunk_0.mmap", Path.unlink),
    "offsets-deleted": ("vector_storage-tokens/offsets/chunk_0.mmap", Path.unlink),
    "offsets-corrupt": ("vector_storage-tokens/offsets/chunk_0.mmap", flip),
    "offsets-state-deleted": ("vector_storage-tokens/offsets/status.dat", Path.unlink),
    "payload-corrupt": ("payload_storage/page_0.dat", flip),
    "payload-emptied": ("payload_storage/page_0.dat", empty),
    "vector-state-emptied": ("vector_storage-tokens/vectors/status.dat", empty),
    "deleted-flags-state-emptied": ("vector_storage-pooled/deleted/status.dat", empty),
}


def use_everything(root: Path, model) -> None:
    """Open the index and do what a user does: search (both ways), list ids, verify."""
    with xmatch.index.open(root, model) as index:
        queries = ragged(2, seed=1, pooled=False)
        index.search(queries, 5)
        index.search(queries, 5, exact=True)
        assert len(index.ids) == 30
        index.verify()


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_segment_file_is_named_with_the_fix(tmp_path, damage):
    index = edge_index(tmp_path / "idx")
    index.close()
    name, spoil = DAMAGE[damage]
    spoil(segment(tmp_path / "idx") / name)
    with pytest.raises(DamagedIndexError) as caught:
        use_everything(tmp_path / "idx", index.model)
    message = str(caught.value)
    assert str(tmp_path / "idx" / "qdrant") in message and "restore the index folder from a copy" in message.lower()


def test_xmatch_search_on_a_damaged_edge_index_says_so_in_one_line(tmp_path):
    index = edge_index(tmp_path / "idx")
    index.close()
    flip(segment(tmp_path / "idx") / "vector_storage-tokens/offsets/chunk_0.mmap")  # opens, fails in the search
    done = run("-m", "xmatch", "search", str(tmp_path / "idx"), "--text", "a red circle", "-k", "3")
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert "Traceback" not in done.stderr and "panicked" not in done.stderr
    assert lines[0].startswith("xmatch search: the Qdrant shard") and str(tmp_path / "idx" / "qdrant") in lines[0]
    assert "rebuild the index" in lines[0]


CAPPED_OPEN = """
    import resource, sys
    import xmatch.index
    from xmatch.index.synthetic import scoring_model
    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, resource.RLIM_INFINITY))  # a huge allocation fails, not the machine
    xmatch.index.open(sys.argv[1], scoring_model("MrSw", 16)).verify()
"""


def test_an_internal_id_past_the_segment_is_refused_before_edge_sizes_a_table_by_it(tmp_path):
    """Found by the fuzz suite: one flipped byte in the id tracker's log made Edge allocate
    58 GB while loading (the process aborted: no error to catch)."""
    pytest.importorskip("resource")
    index = edge_index(tmp_path / "idx")
    index.close()
    mappings = segment(tmp_path / "idx") / "mutable_id_tracker.mappings"
    data = bytearray(mappings.read_bytes())
    data[12] ^= 0x80  # the high byte of the first entry's internal id (tag, 8-byte point id, 4-byte internal id)
    mappings.write_bytes(bytes(data))
    done = run("-c", textwrap.dedent(CAPPED_OPEN), str(tmp_path / "idx"))
    assert done.returncode == 1, done.stderr[-2000:]
    assert f"DamagedIndexError: {mappings} maps a point to internal id" in done.stderr


def fingerprint(folder: Path) -> dict[str, tuple[int, int, str]]:
    """Every file under ``folder``: size, modification time, content hash."""
    out = {}
    for parent, _, files in os.walk(folder):
        for name in files:
            path = Path(parent) / name
            out[str(path.relative_to(folder))] = (path.stat().st_size, path.stat().st_mtime_ns,
                                                  hashlib.sha256(path.read_bytes()).hexdigest())
    return out


OPEN = """
    import sys
    import xmatch.index
    from xmatch.index.synthetic import scoring_model
    xmatch.index.open(sys.argv[1], scoring_model("MrSw", 16))
"""


def test_a_refused_second_opener_touches_nothing_of_the_holders_shard(tmp_path):
    """Edge's own lock (on its log) comes after it loaded the segments, which replays and
    deletes their tracker journals: the holder's next add failed ("Tracker journal ... is
    shorter than expected", 2 of 2 runs). xmatch's lock comes before Edge reads anything."""
    holder = edge_index(tmp_path / "idx")
    before = fingerprint(tmp_path / "idx" / "qdrant")
    done = run("-c", textwrap.dedent(OPEN), str(tmp_path / "idx"))
    assert done.returncode == 1 and "SearchIndexError" in done.stderr
    assert f"open in another process or index object (process {os.getpid()} on " in done.stderr
    assert fingerprint(tmp_path / "idx" / "qdrant") == before
    holder.add(ragged(4, seed=9), ids=[f"new{i}" for i in range(4)])
    assert len(holder) == 34 and holder.search(ragged(4, seed=9)[:1], 1)[0].ids == ["new0"]
    holder.verify()
    holder.close()


def test_a_shard_that_cannot_be_locked_says_the_folder_must_be_writable(tmp_path, monkeypatch):
    """A read-only index folder (as root, permissions do not stop writes: the file system is faked)."""
    index = edge_index(tmp_path / "idx")
    index.close()
    real = os.open

    def read_only(path, flags, *args, **options):
        if os.fspath(path).endswith("xmatch.lock"):
            raise OSError(errno.EROFS, "Read-only file system", os.fspath(path))
        return real(path, flags, *args, **options)

    monkeypatch.setattr(os, "open", read_only)
    with pytest.raises(SearchIndexError, match=r"qdrant cannot be locked \(Read-only file system.*must be writable"):
        xmatch.index.open(tmp_path / "idx", index.model)


REMOVE = """
    import sys
    from pathlib import Path
    from xmatch.index.store import remove_index
    remove_index(Path(sys.argv[1]))
"""


def test_overwrite_and_remove_in_another_process_leave_a_held_shard_alone(tmp_path):
    reader = edge_index(tmp_path / "idx")
    queries = ragged(3, seed=3, pooled=False)
    answers = [r.ids for r in reader.search(queries, 5)]
    before = fingerprint(tmp_path / "idx")
    overwrite = run("-m", "xmatch", "index", "--out", str(tmp_path / "idx"), "--overwrite")
    assert overwrite.returncode == 2 and "Traceback" not in overwrite.stderr
    assert f"(process {os.getpid()} on " in overwrite.stderr and "is not removed while its shard is open" in overwrite.stderr
    removal = run("-c", textwrap.dedent(REMOVE), str(tmp_path / "idx"))
    assert removal.returncode == 1 and f"SearchIndexError: the Qdrant shard {tmp_path / 'idx' / 'qdrant'}" in removal.stderr
    assert fingerprint(tmp_path / "idx") == before
    assert [r.ids for r in reader.search(queries, 5)] == answers
    reader.add(ragged(2, seed=4), ids=["a", "b"])
    reader.close()
    assert run("-c", textwrap.dedent(REMOVE), str(tmp_path / "idx")).returncode == 0  # nobody holds it now
    assert not (tmp_path / "idx").exists()


def sizes(folder: Path) -> tuple[int, int]:
    """(apparent bytes, allocated bytes) of the files under ``folder``, as ``du --apparent-size`` and ``du`` count."""
    apparent = allocated = 0
    for parent, _, files in os.walk(folder):
        for name in files:
            st = os.lstat(os.path.join(parent, name))
            apparent, allocated = apparent + st.st_size, allocated + st.st_blocks * 512
    return apparent, allocated


def test_a_copy_costs_the_real_size_of_the_index(tmp_path, capsys):
    """60 items: about 200 MB apparent (Edge preallocates 32 MiB chunks and pages, sparse),
    a few hundred KB on disk; ``xmatch index --copy`` writes the latter."""
    from xmatch.cli.main import main

    source = edge_index(tmp_path / "src", n=60)
    queries = ragged(3, seed=3, pooled=False)
    answers = [r.ids for r in source.search(queries, 5)]
    assert main(["index", "--copy", str(tmp_path / "src"), "--out", str(tmp_path / "dst")]) == 2  # held: refused
    assert "open in another process or index object" in capsys.readouterr().err and not (tmp_path / "dst").exists()
    source.close()
    assert main(["index", "--copy", str(tmp_path / "src"), "--out", str(tmp_path / "dst")]) == 0
    apparent, allocated = sizes(tmp_path / "src")
    copy_apparent, copy_allocated = sizes(tmp_path / "dst")
    assert apparent > 100 * 2**20 and allocated < 4 * 2**20
    locks = [tmp_path / "src" / "qdrant" / "xmatch.lock", tmp_path / "src" / ".lock"]  # the source's, not copied
    assert copy_apparent == apparent - sum(p.stat().st_size for p in locks if p.exists())
    assert copy_allocated <= allocated
    assert "MiB on disk" in capsys.readouterr().out
    with xmatch.index.open(tmp_path / "dst", source.model) as copy:
        assert [r.ids for r in copy.search(queries, 5)] == answers
        copy.verify()
        copy.add(ragged(2, seed=8), ids=["x", "y"])
    assert main(["index", "--copy", str(tmp_path / "src"), "--out", str(tmp_path / "dst")]) == 2  # not over an index
    assert "is not an empty folder" in capsys.readouterr().err


def test_nan_in_an_edge_shards_vectors_fails_verify_and_is_not_served_first(tmp_path):
    index = edge_index(tmp_path / "idx")
    stored = index.store.gather(torch.arange(30))
    index.close()
    chunk = segment(tmp_path / "idx") / "vector_storage-tokens" / "vectors" / "chunk_0.mmap"
    first = torch.frombuffer(bytearray(chunk.read_bytes()[:4 * DIM]), dtype=torch.float32)
    row = int((stored.tokens[:, 0] == first).all(dim=1).nonzero()[0])  # the item whose first token Edge stored first
    with open(chunk, "r+b") as f:
        f.write(torch.full((DIM,), math.nan).numpy().tobytes())
    with xmatch.index.open(tmp_path / "idx", index.model) as again:
        with pytest.raises(DamagedIndexError, match=rf"qdrant holds NaN or infinite values in 1 items .*'item{row}'.*rebuild"):
            again.verify()
        own = ragged(30, seed=0, pooled=False)[row:row + 1]  # the damaged item's own tokens: it would rank first
        result = again.search(own, 5, exact=True)[0]
        assert f"item{row}" not in result.ids
        assert all(math.isfinite(h.score) for h in result.hits)


OVERWRITE = """
    import sys
    from pathlib import Path
    import xmatch.index
    from xmatch.index.store import remove_index
    from test_qdrant_edge import ragged
    from xmatch.index.synthetic import scoring_model
    remove_index(Path(sys.argv[1]))
    index = xmatch.index.create(sys.argv[1], scoring_model("MrSw", 16), engine=sys.argv[2], dtype="float32")
    index.add(ragged(30, seed=7), ids=[f"new{i}" for i in range(30)])
    index.close()
"""


def test_a_same_count_overwrite_by_another_process_is_seen(tmp_path):
    """An open Edge index holds its shard: a same-count overwrite by another process is refused
    while it is open (so the reader never answers from a corpus that is gone), and one made
    while no process holds the shard (here: a FAISS reader's index replaced by an Edge one of
    as many items) is seen by the reader's next search."""
    reader = edge_index(tmp_path / "edge")
    queries = ragged(30, seed=7, pooled=False)[:3]
    refused = run("-c", textwrap.dedent(OVERWRITE), str(tmp_path / "edge"), "qdrant")
    assert refused.returncode == 1 and f"(process {os.getpid()} on " in refused.stderr
    assert all(i.startswith("item") for r in reader.search(queries, 5, exact=True) for i in r.ids)
    reader.close()

    model = scoring_model("MrSw", DIM)
    faiss_reader = xmatch.index.create(tmp_path / "faiss", model, dtype="float32")
    faiss_reader.add(ragged(30, seed=0), ids=[f"item{i}" for i in range(30)])
    assert faiss_reader.search(queries, 5)[0].ids[0].startswith("item")
    done = run("-c", textwrap.dedent(OVERWRITE), str(tmp_path / "faiss"), "qdrant")
    assert done.returncode == 0, done.stderr
    assert json.loads((tmp_path / "faiss" / "index.json").read_text())["items"] == 30
    for result in faiss_reader.search(queries, 5, exact=True):
        assert result.exact and all(i.startswith("new") for i in result.ids)
    assert [r.ids[0] for r in faiss_reader.search(queries, 1)] == ["new0", "new1", "new2"]
    faiss_reader.close()
