"""``xmatch train``: a spec file with its [train] table, overrides from the command line, a
run folder that ``xmatch eval`` reads; and the same run on two processes through torchrun."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from xmatch.cli.main import main

from conftest import FIXTURES
from learnable import FEATURE_DIM, write_learnable

SPEC = """
embed_dim = 16
[image_encoder]
name = "bottomup"
feature_dim = {feature_dim}
layers = 1
ff_dim = 32
dropout = 0.0
[text_encoder]
name = "bert"
backbone = "{bert}"
layers = 1
pretrained = false
[image_reasoner]
name = "transformer"
layers = 1
ff_dim = 32
dropout = 0.0
[text_reasoner]
name = "transformer"
layers = 1
ff_dim = 32
dropout = 0.0
[pooler]
name = "MrSw"
[loss]
name = "hinge"
[train]
epochs = 2
batch_size = 20
lr = 1e-3
global_negatives = true
log_every_steps = 1
tensorboard = false
"""


@pytest.fixture(scope="module")
def setup_files(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("train-cli")
    data = write_learnable(root / "data")
    # BERT without dropout: two processes then draw nothing at random and must agree exactly
    bert = root / "bert"
    bert.mkdir()
    for f in (FIXTURES / "teran-original" / "mrsw-small" / "bert").iterdir():
        (bert / f.name).write_bytes(f.read_bytes())
    config = json.loads((bert / "config.json").read_text())
    config.update(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    (bert / "config.json").write_text(json.dumps(config))
    spec = root / "spec.toml"
    spec.write_text(SPEC.format(feature_dim=FEATURE_DIM, bert=bert))
    return spec, data


def train_args(spec: Path, data: Path, out: Path) -> list[str]:
    return ["train", str(spec), "--data", str(data), "--dataset", "scan-precomp", "--val-split", "dev",
            "--data-option", "boxes_normalized=true", "--data-option", "max_images=20", "--out", str(out),
            "--no-progress"]


def rows(path: Path) -> list[dict[str, str]]:
    return list(csv.DictReader(path.open()))


def test_train_command_runs_the_spec_recipe_and_eval_reads_the_best_model(setup_files, tmp_path, capsys):
    spec, data = setup_files
    out = tmp_path / "run"
    assert main(train_args(spec, data, out) + ["--set", "epochs=1", "--set", 'scheduler="cosine"']) == 0
    printed = capsys.readouterr().out
    assert "trained 5 steps (1 epochs)" in printed
    assert json.loads((out / "run.json").read_text())["train"]["scheduler"] == "cosine"
    assert len(rows(out / "train.csv")) == 5 and len(rows(out / "val.csv")) == 1
    assert main(["eval", f"local-dir:{out / 'best'}", "--data", str(data), "--dataset", "scan-precomp",
                 "--split", "dev", "--data-option", "boxes_normalized=true", "--json", str(tmp_path / "r.json")]) == 0
    evaluated = json.loads((tmp_path / "r.json").read_text())
    assert evaluated["rsum"] == pytest.approx(float(rows(out / "val.csv")[0]["rsum"]))


def test_train_command_errors_are_clear(setup_files, tmp_path, capsys):
    spec, data = setup_files
    assert main(train_args(spec, data, tmp_path / "r") + ["--set", "epoch=1"]) == 2
    assert "train -> epoch: unknown training setting. Did you mean 'epochs'" in capsys.readouterr().err
    assert main(train_args(spec, data, tmp_path / "r") + ["--val-split", "nope"]) == 2
    assert "nope" in capsys.readouterr().err


@pytest.mark.slow
def test_two_process_ddp_gives_the_single_process_run_on_the_same_global_batch(setup_files, tmp_path):
    spec, data = setup_files
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    one = subprocess.run([sys.executable, "-m", "xmatch", *train_args(spec, data, tmp_path / "one")],
                         env=env, capture_output=True, text=True, timeout=600)
    assert one.returncode == 0, one.stderr
    two = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", "29517",
         "-m", "xmatch", *train_args(spec, data, tmp_path / "two")],
        env=env, capture_output=True, text=True, timeout=600,
    )
    assert two.returncode == 0, two.stderr
    assert "2 process(es) on cpu" in two.stdout
    a, b = rows(tmp_path / "one" / "train.csv"), rows(tmp_path / "two" / "train.csv")
    assert len(a) == len(b) == 10
    for x, y in zip(a, b):
        assert float(x["loss"]) == pytest.approx(float(y["loss"]), rel=1e-5)
        assert float(x["pairs_per_s"]) > 0 and float(y["pairs_per_s"]) > 0
    va, vb = rows(tmp_path / "one" / "val.csv"), rows(tmp_path / "two" / "val.csv")
    for x, y in zip(va, vb):
        for key in ("rsum", "i2t_r1", "i2t_r5", "i2t_r10", "t2i_r1", "t2i_r5", "t2i_r10"):
            assert float(x[key]) == float(y[key]), key
    # only rank 0 wrote: one final bundle, one set of logs
    assert (tmp_path / "two" / "final" / "model.safetensors").is_file()
