"""xmatch.index against hostile folders and bad input: nothing it reads makes it write outside
the index, non-finite or mismatched embeddings are refused before they are stored, options are
checked, an open index sees other processes' appends, and a failed `xmatch index` leaves nothing
that blocks the corrected rerun."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest
import torch

import xmatch
import xmatch.index
from xmatch.index import DamagedIndexError, SearchIndexError
from xmatch.index.synthetic import scoring_model

from test_search import DIM, TEXTS, regions

pytest.importorskip("faiss")


@pytest.fixture(scope="module")
def model() -> xmatch.MatchingModel:
    return scoring_model("MrSw", DIM)


@pytest.fixture()
def index(tmp_path, model) -> xmatch.index.SearchIndex:
    idx = xmatch.index.create(tmp_path / "idx", model, dtype="float32")
    feats, boxes, mask = regions(20)
    idx.add(xmatch.RegionInputs(feats, boxes, mask))
    return idx


def encoded(model, n: int, seed: int) -> xmatch.Embeddings:
    feats, boxes, mask = regions(n, seed=seed)
    with torch.no_grad():
        return model.encode_images(xmatch.RegionInputs(feats, boxes, mask))


def shard_files(index) -> list[str]:
    return sorted(p.name for p in (index.root / "shards").iterdir())


# --- non-finite and mismatched embeddings ----------------------------------------------------------


@pytest.mark.parametrize("where", ["token", "pooled", "inf"])
def test_non_finite_embeddings_are_refused_before_anything_is_written(index, model, where):
    e = encoded(model, 3, seed=1)
    if where == "token":
        e.tokens[1, 0, 3] = float("nan")
    elif where == "pooled":
        e.pooled[2, 0] = float("nan")
    else:
        e.tokens[0, 1, 0] = float("inf")
    before = shard_files(index)
    with pytest.raises(SearchIndexError, match="NaN or infinite values.*nothing was added"):
        index.add(e, ids=["a", "b", "c"])
    assert len(index) == 20 and shard_files(index) == before
    assert all(h.score == h.score for h in index.search_texts(TEXTS, k=5)[0].hits)  # no NaN ranks first


def test_nan_in_a_padding_position_is_not_an_error(index, model):
    e = encoded(model, 2, seed=1)
    e = xmatch.Embeddings(torch.cat([e.tokens, torch.full((2, 1, DIM), float("nan"))], dim=1),
                          torch.cat([e.mask, torch.zeros(2, 1, dtype=torch.bool)], dim=1), e.pooled)
    assert index.add(e, ids=["p", "q"]) == 2


def test_verify_finds_non_finite_values_already_on_disk(index, model):
    e = encoded(model, 2, seed=1)
    e.tokens[0, 0, 0] = float("nan")
    index.store.add(e.trimmed(), ["old-nan", "ok"])  # as an index written before the check would hold it
    with pytest.raises(DamagedIndexError, match="NaN or infinite values in 1 items.*'old-nan'"):
        xmatch.index.open(index.root, model).verify()


def test_embeddings_without_the_models_pooled_vectors_are_refused(tmp_path, index, model):
    e = encoded(model, 2, seed=1)
    assert e.pooled is not None  # the scoring model makes global vectors
    bare = xmatch.Embeddings(e.tokens, e.mask)
    with pytest.raises(SearchIndexError, match="no pooled .* vectors, but the model of the index"):
        index.add(bare, ids=["a", "b"])
    empty = xmatch.index.create(tmp_path / "empty", model)
    with pytest.raises(SearchIndexError, match="no pooled"):
        empty.add(bare, ids=["a", "b"])  # an empty index asks the model
    assert len(empty) == 0 and len(index) == 20
    assert index.search_texts(TEXTS, k=3, stage1="pooled")[0].hits  # default searches still work
    assert empty.add(e, ids=["a", "b"]) == 2


# --- files outside the index ---------------------------------------------------------------------


def test_a_shards_link_out_of_the_index_is_refused_and_nothing_there_is_touched(tmp_path, model):
    victim = tmp_path / "photos"
    victim.mkdir()
    (victim / "important.txt").write_text("keep me")
    (victim / "photo.jpg").write_bytes(b"\xff\xd8")
    idx = xmatch.index.create(tmp_path / "idx", model)
    os.symlink(victim, idx.root / "shards")
    with pytest.raises(DamagedIndexError, match="shards is a symbolic link.*writes only inside its own folder"):
        idx.add(encoded(model, 2, seed=0))
    assert sorted(p.name for p in victim.iterdir()) == ["important.txt", "photo.jpg"]


def test_append_removes_only_the_shard_files_it_wrote(index, model):
    folder = index.root / "shards"
    (folder / "notes.txt").write_text("mine")
    (folder / "00000007.safetensors.partial").write_bytes(b"a killed append's half shard")
    outside = index.root.parent / "elsewhere.safetensors"
    outside.write_bytes(b"x")
    os.symlink(outside, folder / "00000008.safetensors")
    index.add(encoded(model, 2, seed=3), ids=["a", "b"])
    assert shard_files(index) == ["00000000.safetensors", "00000001.safetensors", "00000008.safetensors", "notes.txt"]
    assert outside.read_bytes() == b"x"


@pytest.mark.parametrize("damage, message", [
    (lambda s: s.pop("sha256"), "shard record 0 is not"),
    (lambda s: s.update(file="../../etc/passwd"), "not a file in shards/"),
    (lambda s: s.update(file="/etc/passwd"), "not a file in shards/"),
    (lambda s: s.update(count="20"), "shard record 0 is not"),
])
def test_damaged_manifests_name_the_file_and_the_fix(index, model, damage, message):
    path = index.root / "index.json"
    manifest = json.loads(path.read_text())
    damage(manifest["shards"][0])
    path.write_text(json.dumps(manifest))
    with pytest.raises(DamagedIndexError, match=message) as caught:
        xmatch.index.open(index.root, model)
    assert str(path) in str(caught.value) and "rebuild the index" in str(caught.value)
    assert "root:" not in str(caught.value)  # nothing read from /etc/passwd


def test_cli_names_a_damaged_manifest_in_one_line(index, capsys):
    from xmatch.cli.main import main

    path = index.root / "index.json"
    manifest = json.loads(path.read_text())
    del manifest["shards"][0]["sha256"]
    path.write_text(json.dumps(manifest))
    assert main(["search", str(index.root), "--text", "a red circle", "-k", "2"]) == 2
    err = capsys.readouterr().err
    assert "index.json" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


# --- options -------------------------------------------------------------------------------------


@pytest.mark.parametrize("option", [{"candidates": 0}, {"candidates": -5}, {"k": 2.5}, {"k": "5"}, {"k": True},
                                    {"nprobe": 0}, {"candidates": 1.5}])
def test_bad_search_options_are_refused_at_once(index, option):
    outcome: dict[str, BaseException] = {}

    def run() -> None:
        try:
            index.search_texts(TEXTS[:1], **({"k": 3} | option))
        except BaseException as exc:  # noqa: BLE001 - the outcome is asserted below
            outcome["error"] = exc

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(30)  # candidates=0 used to spin forever
    assert not worker.is_alive(), f"search({option}) did not return"
    name = next(iter(option))
    assert isinstance(outcome.get("error"), ValueError) and f"{name} must be a whole number >= 1" in str(outcome["error"])


def test_numpy_integers_are_whole_numbers(index):
    assert len(index.search_texts(TEXTS[:1], k=np.int64(3), candidates=np.int32(10))[0].hits) == 3


def test_cli_search_candidates_zero_is_an_error_not_a_hang(index, capsys):
    from xmatch.cli.main import main

    assert main(["search", str(index.root), "--text", "a red circle", "-k", "2", "--candidates", "0"]) == 2
    assert "candidates must be a whole number >= 1" in capsys.readouterr().err


# --- freshness -----------------------------------------------------------------------------------

APPEND = textwrap.dedent("""
    import sys, torch, xmatch, xmatch.index
    from xmatch.index.synthetic import scoring_model
    index = xmatch.index.open(sys.argv[1], scoring_model("MrSw", 32))
    e = xmatch.Embeddings(torch.nn.functional.normalize(torch.ones(1, 6, 32), dim=-1), torch.ones(1, 6, dtype=torch.bool),
                          torch.nn.functional.normalize(torch.ones(1, 32), dim=-1))
    index.add(e, ["from-another-process"])
""")


def test_an_open_index_answers_from_appends_committed_by_another_process(index, model):
    reader = xmatch.index.open(index.root, model)
    assert reader.search_texts(TEXTS[:1], k=5)[0].total == 20
    env = dict(os.environ, OMP_NUM_THREADS="1")
    subprocess.run([sys.executable, "-c", APPEND, str(index.root)], env=env, check=True, capture_output=True)
    result = reader.search_texts(TEXTS[:1], k=21, exact=True)[0]
    assert result.total == 21 and len(reader) == 21 and "from-another-process" in result.ids and result.exact
    fresh = xmatch.index.open(index.root, model).search_texts(TEXTS[:1], k=5)[0]
    assert reader.search_texts(TEXTS[:1], k=5)[0].ids == fresh.ids


def test_a_removed_index_is_named(index, model):
    os.remove(index.root / "index.json")
    with pytest.raises(DamagedIndexError, match="index.json is gone"):
        index.search_texts(TEXTS[:1], k=2)


# --- a failed `xmatch index` ---------------------------------------------------------------------


@pytest.fixture()
def bundle(tmp_path_factory):
    folder = tmp_path_factory.mktemp("bundle") / "tiny-model"
    xmatch.save_pretrained(scoring_model("MrSw", 256), folder)
    return folder


def test_a_failed_index_run_leaves_nothing_and_the_rerun_works(tmp_path, capsys, bundle, monkeypatch):
    pytest.importorskip("sklearn")
    import xmatch.index.build
    from xmatch.cli.main import main

    out = tmp_path / "idx"
    data = ["--dataset", "scenes", "--data", str(tmp_path / "scenes"), "--data-option", "size=tiny",
            "--data-option", "backbone=test_efficientnet", "--data-option", "weights=random"]
    assert main(["index", f"local-dir:{bundle}", *data, "--out", str(out), "--no-progress"]) == 2  # not generated
    assert not out.exists()
    capsys.readouterr()

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt
    monkeypatch.setattr(xmatch.index.build, "index_dataset", interrupted)
    with pytest.raises(KeyboardInterrupt):
        main(["index", f"local-dir:{bundle}", *data, "--data-option", "generate=true", "--out", str(out), "--no-progress"])
    assert not out.exists()
    monkeypatch.undo()
    assert main(["index", f"local-dir:{bundle}", *data, "--out", str(out), "--no-progress"]) == 0
    assert "indexed 2 images" in capsys.readouterr().out


def test_overwrite_replaces_an_index_and_never_a_users_files(tmp_path, capsys, bundle, model):
    pytest.importorskip("sklearn")
    from xmatch.cli.main import main

    out = tmp_path / "idx"
    data = ["--dataset", "scenes", "--data", str(tmp_path / "scenes"), "--data-option", "size=tiny",
            "--data-option", "backbone=test_efficientnet", "--data-option", "weights=random", "--data-option", "generate=true"]
    assert main(["index", f"local-dir:{bundle}", *data, "--out", str(out), "--no-progress", "--shard-size", "1"]) == 0
    (out / "README.txt").write_text("my notes")
    assert main(["index", f"local-dir:{bundle}", *data, "--out", str(out), "--no-progress"]) == 2
    assert "--overwrite to replace it" in capsys.readouterr().err
    assert main(["index", f"local-dir:{bundle}", *data, "--out", str(out), "--append", "--overwrite"]) == 2
    assert main(["index", f"local-dir:{bundle}", *data, "--out", str(out), "--no-progress", "--overwrite"]) == 2
    assert "holds files that are not the index's (README.txt)" in capsys.readouterr().err
    assert (out / "README.txt").read_text() == "my notes" and json.loads((out / "index.json").read_text())["dtype"] == "float16"
    (out / "README.txt").unlink()
    assert main(["index", f"local-dir:{bundle}", *data, "--out", str(out), "--no-progress", "--overwrite",
                 "--dtype", "float32"]) == 0
    manifest = json.loads((out / "index.json").read_text())
    assert manifest["items"] == 2 and manifest["dtype"] == "float32"  # a new index, not an append


@pytest.mark.parametrize("location", ["/etc", "../elsewhere", "shards"])
def test_a_refused_qdrant_location_leaves_no_folder(tmp_path, model, location):
    with pytest.raises(ValueError, match="not a folder name inside the index|absolute path|outside"):
        xmatch.index.create(tmp_path / "idx", model, engine="qdrant", qdrant=location)
    assert not (tmp_path / "idx").exists()


def test_an_ann_link_out_of_the_index_is_refused_and_nothing_is_written_there(tmp_path, index, model):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.symlink(elsewhere, index.root / "ann")
    reopened = xmatch.index.open(index.root, model)
    with pytest.raises(DamagedIndexError, match="ann is a symbolic link"):
        reopened.search_texts(TEXTS[:1], k=3)
    assert list(elsewhere.iterdir()) == []
