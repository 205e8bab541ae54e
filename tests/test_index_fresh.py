"""An open index never answers from a corpus that is no longer on disk: every commit and every
overwrite writes a new generation id into the manifest, a reader reloads on any change of it
(reading only the new shards after an append), and a reader that cannot reload says so."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import xmatch
import xmatch.index
import xmatch.index.store
from xmatch.index import SearchIndexError
from xmatch.index.store import read_manifest, write_manifest
from xmatch.index.synthetic import scoring_model

from test_search import DIM, TEXTS, regions

pytest.importorskip("faiss")


@pytest.fixture(scope="module")
def model() -> xmatch.MatchingModel:
    return scoring_model("MrSw", DIM)


def build(root, model, prefix: str, seed: int, batches: int = 2, n: int = 20) -> xmatch.index.SearchIndex:
    """An index of ``n`` images named ``prefix0...``, appended in ``batches`` shards."""
    idx = xmatch.index.create(root, model, dtype="float32")
    feats, boxes, mask = regions(n, seed=seed)
    for part in torch.arange(n).chunk(batches):
        idx.add(xmatch.RegionInputs(feats[part], boxes[part], mask[part]), ids=[f"{prefix}{i}" for i in part.tolist()])
    return idx


def run(script: str, *args: str) -> None:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(script), *args], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


# another process replaces the index by one of as many items, other ids, other tokens
OVERWRITE = """
    import sys, torch, xmatch, xmatch.index
    from xmatch.index.store import remove_index
    from xmatch.index.synthetic import scoring_model
    from pathlib import Path
    sys.path.insert(0, sys.argv[2])
    from test_index_fresh import build
    remove_index(Path(sys.argv[1]))
    build(Path(sys.argv[1]), scoring_model("MrSw", 32), "new", seed=7)
"""


def test_every_commit_writes_a_new_generation(tmp_path, model):
    idx = xmatch.index.create(tmp_path / "idx", model)
    seen = [read_manifest(idx.root)["generation"]]
    feats, boxes, mask = regions(4)
    for k in range(2):
        idx.add(xmatch.RegionInputs(feats[2 * k : 2 * k + 2], boxes[2 * k : 2 * k + 2], mask[2 * k : 2 * k + 2]))
        seen.append(read_manifest(idx.root)["generation"])
    assert len(set(seen)) == 3 and all(isinstance(g, str) and len(g) == 32 for g in seen)
    assert idx.manifest["generation"] == seen[-1]  # the writer's own view is the committed one


@pytest.mark.parametrize("exact", [True, False])
def test_a_same_count_overwrite_by_another_process_is_seen(tmp_path, model, exact):
    old = build(tmp_path / "idx", model, "old", seed=0)
    reader = xmatch.index.open(old.root, model)
    assert all(i.startswith("old") for i in reader.search_texts(TEXTS, k=5, exact=exact)[0].ids)
    run(OVERWRITE, str(old.root), os.path.dirname(__file__))
    assert json.loads((old.root / "index.json").read_text())["items"] == 20  # the same count
    results = reader.search_texts(TEXTS, k=5, exact=exact)
    fresh = xmatch.index.open(old.root, model).search_texts(TEXTS, k=5, exact=exact)
    assert [r.ids for r in results] == [r.ids for r in fresh]
    assert all(i.startswith("new") for r in results for i in r.ids) and all(r.exact for r in results)
    assert reader.ids == [f"new{i}" for i in range(20)]


def test_an_overwrite_by_the_command_line_is_seen(tmp_path, model, capsys):
    from xmatch.cli.main import main

    build(tmp_path / "other", model, "val", seed=3)
    old = build(tmp_path / "idx", model, "test", seed=0)
    old.close()
    reader = xmatch.index.open(tmp_path / "idx", model)
    assert reader.search_texts(TEXTS[:1], k=3)[0].ids[0].startswith("test")
    assert main(["index", "--from-index", str(tmp_path / "other"), "--out", str(tmp_path / "idx"), "--overwrite",
                 "--dtype", "float32", "--no-progress"]) == 0
    capsys.readouterr()
    result = reader.search_texts(TEXTS[:1], k=20, exact=True)[0]
    assert sorted(result.ids) == sorted(f"val{i}" for i in range(20)) and result.exact
    assert main(["search", str(tmp_path / "idx"), "--text", TEXTS[0], "-k", "3", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["hits"][0]["id"] == reader.search_texts(TEXTS[:1], k=3)[0].ids[0]


APPEND = """
    import sys, torch, xmatch, xmatch.index
    from xmatch.index.synthetic import scoring_model
    index = xmatch.index.open(sys.argv[1], scoring_model("MrSw", 32))
    e = xmatch.Embeddings(torch.nn.functional.normalize(torch.ones(1, 6, 32), dim=-1), torch.ones(1, 6, dtype=torch.bool),
                          torch.nn.functional.normalize(torch.ones(1, 32), dim=-1))
    index.add(e, ["from-another-process"])
"""


def test_the_reload_after_a_foreign_append_reads_only_the_new_shard(tmp_path, model, monkeypatch):
    old = build(tmp_path / "idx", model, "img", seed=0, batches=4)
    reader = xmatch.index.open(old.root, model)
    reader.search_texts(TEXTS[:1], k=5)  # the stage-1 scan has read the four shards
    run(APPEND, str(old.root))
    opened, read = [], []

    class Counting(xmatch.index.store.Shard):
        def __init__(self, path, *args, **kwargs):
            opened.append(path.name)
            super().__init__(path, *args, **kwargs)

    monkeypatch.setattr(xmatch.index.store, "Shard", Counting)
    monkeypatch.setattr(xmatch.index.store.ShardStore, "blocks", counted(xmatch.index.store.ShardStore.blocks, read))
    result = reader.search_texts(TEXTS[:1], k=21)[0]
    assert opened == ["00000004.safetensors"]  # the store opened the new shard only
    assert read == [20]  # and the stage-1 scan took in the rows from 20 on
    assert "from-another-process" in result.ids and result.exact and result.total == 21 and len(reader) == 21


def counted(blocks, starts: list[int]):
    """``ShardStore.blocks`` recording the first row of every whole-corpus walk it makes."""
    def walk(self, first: int = 0):
        starts.append(first)
        return blocks(self, first)
    return walk


def test_a_reader_that_cannot_reload_says_so_every_time(tmp_path, model):
    old = build(tmp_path / "idx", model, "img", seed=0)
    reader = xmatch.index.open(old.root, model)
    reader.search_texts(TEXTS[:1], k=3)
    manifest = read_manifest(old.root)
    record = dict(manifest["shards"][-1], file="shards/00000002.safetensors")
    manifest["shards"].append(record)  # a commit whose shard is not there (a copy in progress, a lost file)
    manifest["items"] += record["count"]
    write_manifest(old.root, manifest)
    for _ in range(2):  # the second search does not fall back on the state before the change
        with pytest.raises(SearchIndexError, match=r"changed on disk .* could not be reloaded .*00000002.safetensors"
                                                   r".*nothing was answered from the old state"):
            reader.search_texts(TEXTS[:1], k=3)
    with pytest.raises(SearchIndexError, match="could not be reloaded"):
        reader.get(["img0"])


def test_an_overwrite_with_another_model_is_refused_by_the_reader(tmp_path, model):
    old = build(tmp_path / "idx", model, "img", seed=0)
    reader = xmatch.index.open(old.root, model)
    reader.search_texts(TEXTS[:1], k=3)
    manifest = read_manifest(old.root)
    manifest["model"]["fingerprint"] = "0" * 64  # rebuilt with another model
    write_manifest(old.root, manifest)
    with pytest.raises(SearchIndexError, match=r"rebuilt with another model .*Open it again"):
        reader.search_texts(TEXTS[:1], k=3)
