"""A run folder is read as it is (issue 38): no symbolic link inside it is followed (a resumed
run would read what a link points to, then write over it), and its JSON files have a bounded
nesting depth with a clear error instead of a RecursionError."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

import xmatch
from xmatch.data import open_dataset
from xmatch.eval.suite import ResultFileError, load_records
from xmatch.io.run_folder import RunFolderError, read_run_record
from xmatch.io.safe_load import MAX_JSON_DEPTH, JsonDepthError, load_json
from xmatch.train import TrainConfig, Trainer
from xmatch.train import checkpoint as ckpt
from xmatch.train.logs import CsvLog

from conftest import tiny_spec
from learnable import FEATURE_DIM, write_learnable


@pytest.fixture(scope="module")
def data_root(tmp_path_factory) -> Path:
    return write_learnable(tmp_path_factory.mktemp("learnable"))


def train(fixture_bert: str, root: Path, out: Path, **options) -> Trainer:
    torch.manual_seed(0)
    spec = tiny_spec(fixture_bert)
    spec["image_encoder"]["feature_dim"] = FEATURE_DIM
    data = open_dataset("scan-precomp", root, split="train", boxes_normalized=True, max_images=8)
    config = TrainConfig(epochs=1, batch_size=10, lr=1e-3, tensorboard=False, checkpoint_every_steps=1,
                         keep_checkpoints=2, log_every_steps=1, **options.pop("config", {}))
    trainer = Trainer(xmatch.build(spec), data, config, run_dir=out, progress=False, **options)
    trainer.fit()
    return trainer


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def link_in_place(path: Path, outside: Path) -> None:
    """Move ``path`` (a file or a folder of the run) to ``outside`` and leave a link to it."""
    os.replace(path, outside)
    path.symlink_to(outside, target_is_directory=outside.is_dir())


@pytest.mark.parametrize("member", ["train.csv", "val.csv", "run.json", "checkpoints/step-00000002",
                                    "checkpoints/step-00000002/model.safetensors",
                                    "checkpoints/step-00000002/trainer_state.pt", "checkpoints/latest"])
def test_a_link_inside_a_run_folder_is_refused_and_what_it_points_to_is_untouched(
    fixture_bert, data_root, tmp_path, member
):
    run = tmp_path / "run"
    train(fixture_bert, data_root, run, config={"max_steps": 2})
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    if member == "val.csv":
        (run / member).write_text("step,r1\n1,50.0\n")
    outside = elsewhere / Path(member).name
    link_in_place(run / member, outside)
    before = snapshot(elsewhere) if outside.is_dir() else outside.read_bytes()
    with pytest.raises(RunFolderError, match=r"symbolic link") as info:
        train(fixture_bert, data_root, run, resume=True, config={"max_steps": 3})
    message = str(info.value)
    assert str(run / member) in message and "no links" in message
    assert (snapshot(elsewhere) if outside.is_dir() else outside.read_bytes()) == before
    assert not (run / "checkpoints" / "step-00000003").exists()


def test_each_reader_of_a_run_folder_refuses_a_link_itself(fixture_bert, data_root, tmp_path):
    run = tmp_path / "run"
    train(fixture_bert, data_root, run, config={"max_steps": 1})
    secret = tmp_path / "secret.csv"
    secret.write_text("step,mine\n0,kept\n")
    (run / "train.csv").unlink()
    (run / "train.csv").symlink_to(secret)
    with pytest.raises(RunFolderError, match=r"train\.csv is a symbolic link"):
        CsvLog(run / "train.csv", resume_step=1)
    assert secret.read_text() == "step,mine\n0,kept\n"
    folder = run / "checkpoints" / "step-00000001"
    os.replace(folder / "model.safetensors", tmp_path / "model.safetensors")
    (folder / "model.safetensors").symlink_to(tmp_path / "model.safetensors")
    with pytest.raises(ckpt.CheckpointError, match=r"model\.safetensors is a symbolic link"):
        ckpt.read_checkpoint(folder, xmatch.build(xmatch.build(f"local-dir:{folder}").spec))
    os.replace(run / "run.json", tmp_path / "run.json")
    (run / "run.json").symlink_to(tmp_path / "run.json")
    with pytest.raises(RunFolderError, match=r"run\.json is a symbolic link"):
        read_run_record(run)


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def test_deeply_nested_json_in_a_run_folder_is_a_clear_error(fixture_bert, data_root, tmp_path):
    run = tmp_path / "run"
    train(fixture_bert, data_root, run, config={"max_steps": 1})
    for depth in (MAX_JSON_DEPTH + 1, 100_000):
        (run / "run.json").write_text('{"run_id": ' + nested(depth) + "}")
        with pytest.raises(RunFolderError, match=rf"run\.json .*nested more than {MAX_JSON_DEPTH} levels deep"):
            read_run_record(run)
        with pytest.raises(RunFolderError, match="nested more than"):
            train(fixture_bert, data_root, run, resume=True, config={"max_steps": 2})


def test_json_depth_is_bounded_everywhere_the_shared_reader_is_used(tmp_path):
    assert load_json(nested(MAX_JSON_DEPTH), "ok.json") == json.loads(nested(MAX_JSON_DEPTH))
    for depth in (MAX_JSON_DEPTH + 1, 100_000):
        with pytest.raises(JsonDepthError, match=r"deep\.json .*nested more than"):
            load_json(nested(depth), "deep.json")
        (tmp_path / "results.json").write_text('{"i2t": {}, "t2i": {}, "provenance": ' + "{\"a\": " * depth + "1"
                                               + "}" * depth + "}")
        with pytest.raises(ResultFileError, match=r"results\.json .*nested more than"):
            load_records(tmp_path / "results.json")
