"""Nothing lost, nothing silently wrong in training and its command line: a run folder holds one
run, a resume continues the same run, a damaged checkpoint or a full disk is named, bad devices,
learning rates, inputs and data paths are one clear sentence."""

from __future__ import annotations

import errno
import json
import logging
import os
import subprocess
from pathlib import Path

import pytest
import torch

import xmatch
from xmatch.cli.main import main
from xmatch.data import open_dataset
from xmatch.data.fit import check_images_fit
from xmatch.data.layouts import guess_layouts
from xmatch.core.devices import DeviceError, resolve_device
from xmatch.train import ConfigError, TrainConfig, Trainer, TrainingError
from xmatch.train import checkpoint as ckpt
from xmatch.io.run_folder import RunFolderError
from xmatch.io.run_folder import resume_changes

from conftest import random_regions, tiny_spec
from learnable import FEATURE_DIM, write_learnable


@pytest.fixture(scope="module")
def data_root(tmp_path_factory) -> Path:
    return write_learnable(tmp_path_factory.mktemp("learnable"))


def small_model(fixture_bert: str) -> xmatch.MatchingModel:
    torch.manual_seed(0)
    spec = tiny_spec(fixture_bert)
    spec["image_encoder"]["feature_dim"] = FEATURE_DIM
    return xmatch.build(spec)


def small_data(root: Path, max_images: int = 8):
    return open_dataset("scan-precomp", root, split="train", boxes_normalized=True, max_images=max_images)


CONFIG = dict(epochs=1, batch_size=10, lr=1e-3, tensorboard=False, checkpoint_every_steps=1, keep_checkpoints=2)


def run(fixture_bert: str, data, out: Path, **options) -> Trainer:
    settings = {**CONFIG, **options.pop("config", {})}
    trainer = Trainer(small_model(fixture_bert), data, TrainConfig(**settings), run_dir=out, progress=False, **options)
    trainer.fit()
    return trainer


# --- one run per folder --------------------------------------------------------------------------


def test_a_reused_run_folder_is_refused_and_overwrite_replaces_the_old_run(fixture_bert, data_root, tmp_path):
    data = small_data(data_root)
    run(fixture_bert, data, tmp_path, config={"epochs": 2})
    first = json.loads((tmp_path / "run.json").read_text())
    kept = sorted(p.name for p in (tmp_path / "checkpoints").glob("step-*"))
    assert kept == ["step-00000007", "step-00000008"]

    with pytest.raises(RunFolderError, match=r"not empty .*--resume .*--overwrite"):
        run(fixture_bert, data, tmp_path)
    # nothing of the first run was touched by the refusal
    assert sorted(p.name for p in (tmp_path / "checkpoints").glob("step-*")) == kept
    assert json.loads((tmp_path / "run.json").read_text()) == first

    (tmp_path / "notes.txt").write_text("mine")
    run(fixture_bert, data, tmp_path, overwrite=True)
    second = json.loads((tmp_path / "run.json").read_text())
    assert second["run_id"] != first["run_id"]
    # only the new run's checkpoints, logs and pointer; the user's own file stays
    assert sorted(p.name for p in (tmp_path / "checkpoints").glob("step-*")) == ["step-00000003", "step-00000004"]
    assert (tmp_path / "checkpoints" / "latest").read_text() == "step-00000004"
    assert (tmp_path / "notes.txt").read_text() == "mine"
    assert (tmp_path / "train.csv").read_text().count("\n") == 1 + 1  # header + step 1 (log every 10)


def test_pruning_removes_only_the_current_runs_checkpoints(fixture_bert, data_root, tmp_path):
    data = small_data(data_root)
    foreign = tmp_path / "checkpoints" / "step-00000001"
    foreign.mkdir(parents=True)
    (foreign / ckpt.RUN_ID_FILE).write_text("another-run")
    trainer = Trainer(small_model(fixture_bert), data, TrainConfig(**CONFIG), run_dir=tmp_path / "run", progress=False)
    trainer.fit()
    for step in range(2, 6):
        ckpt.write_checkpoint(tmp_path, step, trainer.model, {"step": step}, keep=2, run_id="this-run")
    names = sorted(p.name for p in (tmp_path / "checkpoints").glob("step-*"))
    assert names == ["step-00000001", "step-00000004", "step-00000005"]


# --- resuming the same run -----------------------------------------------------------------------


def test_resume_refuses_changes_that_would_not_continue_the_same_run(fixture_bert, data_root, tmp_path, caplog):
    data = small_data(data_root)
    run(fixture_bert, data, tmp_path, config={"max_steps": 2})
    with pytest.raises(RunFolderError) as info:
        run(fixture_bert, data, tmp_path, resume=True, config={"lr": 2e-3, "batch_size": 8})
    message = str(info.value)
    assert "train.batch_size: 10 -> 8" in message and "train.lr: 0.001 -> 0.002" in message and "--force" in message
    with pytest.raises(RunFolderError, match=r"data\.train\.pairs: 40 -> 50"):
        run(fixture_bert, small_data(data_root, max_images=10), tmp_path, resume=True)

    # a safe change is accepted, logged and recorded
    with caplog.at_level(logging.WARNING, logger="xmatch.train.trainer"):
        run(fixture_bert, data, tmp_path, resume=True, config={"max_steps": 3, "keep_checkpoints": 3})
    assert "train.max_steps: 2 -> 3" in caplog.text
    record = json.loads((tmp_path / "run.json").read_text())
    assert record["resumes"][-1] == {"changes": ["train.keep_checkpoints: 2 -> 3", "train.max_steps: 2 -> 3"],
                                     "forced": False}
    # --force accepts the rest and records it as forced
    run(fixture_bert, data, tmp_path, resume=True, force=True, config={"max_steps": 4, "keep_checkpoints": 3, "lr": 2e-3})
    record = json.loads((tmp_path / "run.json").read_text())
    assert record["train"]["lr"] == 2e-3 and record["resumes"][-1]["forced"] is True


def test_which_resume_changes_are_safe():
    record = {"train": {"epochs": 2, "scheduler": "step", "lr": 1e-4}, "data": {"train": {"pairs": 10}}}
    safe, unsafe = resume_changes(record, {"epochs": 3, "scheduler": "step", "lr": 1e-4}, {"train": {"pairs": 10}})
    assert safe == ["train.epochs: 2 -> 3"] and unsafe == []
    # with a cosine schedule the epoch count shapes the learning rate: not safe
    cosine = {"train": {"epochs": 2, "scheduler": "cosine"}}
    assert resume_changes(cosine, {"epochs": 3, "scheduler": "cosine"}, {})[1] == ["train.epochs: 2 -> 3"]
    # an old run.json without a record of recipe or data compares nothing
    assert resume_changes({"spec": {}}, {"lr": 1.0}, {"train": {}}) == ([], [])


# --- damaged checkpoints, a full disk --------------------------------------------------------------


@pytest.mark.parametrize("damage", ["truncated", "hostile"])
def test_a_damaged_trainer_state_is_named_and_the_previous_checkpoint_is_used(
    fixture_bert, data_root, tmp_path, caplog, damage
):
    data = small_data(data_root)
    run(fixture_bert, data, tmp_path, config={"max_steps": 3})
    latest = tmp_path / "checkpoints" / "step-00000003" / ckpt.STATE_FILE
    if damage == "truncated":
        latest.write_bytes(latest.read_bytes()[:100])
    else:
        class Hostile:
            def __reduce__(self):
                return (os.system, ("echo never run",))

        torch.save({"epoch": 0, "hostile": Hostile()}, latest)
    with caplog.at_level(logging.WARNING, logger="xmatch.train.trainer"):
        trainer = run(fixture_bert, data, tmp_path, resume=True, config={"max_steps": 4})
    assert str(latest) in caplog.text and "falling back to the previous kept checkpoint" in caplog.text
    assert "weights_only=False" not in caplog.text and "will likely succeed" not in caplog.text
    assert trainer.run_record and (tmp_path / "checkpoints" / "latest").read_text() == "step-00000004"

    for state in (tmp_path / "checkpoints").glob("step-*/" + ckpt.STATE_FILE):
        state.write_bytes(b"not a checkpoint")
    with pytest.raises(TrainingError, match=r"no checkpoint of .* can be read") as info:
        run(fixture_bert, data, tmp_path, resume=True, config={"max_steps": 5})
    assert "weights_only=False" not in str(info.value)


def test_a_full_disk_names_the_path_and_keeps_the_previous_checkpoint(fixture_bert, data_root, tmp_path, monkeypatch):
    data = small_data(data_root)
    run(fixture_bert, data, tmp_path, config={"max_steps": 2})
    real_save = torch.save

    def full(obj, f, *args, **kwargs):
        real_save(obj, f, *args, **kwargs)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(ckpt.torch, "save", full)
    with pytest.raises(ckpt.DiskFullError, match=r"no space left on the device while writing the checkpoint step-00000003") as info:
        run(fixture_bert, data, tmp_path, resume=True, config={"max_steps": 3})
    assert str(tmp_path / "checkpoints") in str(info.value) and info.value.errno == errno.ENOSPC
    assert not list((tmp_path / "checkpoints").glob(".*partial"))
    assert (tmp_path / "checkpoints" / "latest").read_text() == "step-00000002"


@pytest.mark.slow
def test_a_really_full_disk_during_training_is_a_clear_error(fixture_bert, data_root, tmp_path):
    mount = tmp_path / "small-disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=600k", "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {done.stderr.decode().strip()}")
    try:
        with pytest.raises(ckpt.DiskFullError, match=r"no space left on the device while writing") as info:
            run(fixture_bert, small_data(data_root), mount / "run", config={"keep_checkpoints": 1})
        assert str(mount / "run") in str(info.value)
        assert not list((mount / "run").rglob("*.partial"))
    finally:
        subprocess.run(["umount", "--lazy", str(mount)], check=False)


# --- devices, learning rates, inputs -----------------------------------------------------------------


def test_devices_that_do_not_exist_are_one_clear_sentence(capsys, data_root):
    assert resolve_device("cpu") == torch.device("cpu")
    with pytest.raises(DeviceError, match="'gpu' is not a device name"):
        resolve_device("gpu")
    if not torch.cuda.is_available():
        with pytest.raises(DeviceError, match="torch sees no CUDA device here; use --device cpu"):
            resolve_device("cuda")
        assert main(["train", "teran-mrsw-scenes", "--data", str(data_root), "--dataset", "scan-precomp",
                     "--device", "cuda", "--no-progress"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "use --device cpu" in err


def test_learning_rates_that_overflow_are_config_errors():
    with pytest.raises(ConfigError, match=r"lr: 1e\+38 is too large: Adam's first step .* overflows float32"):
        TrainConfig(lr=1e38)
    with pytest.raises(ConfigError, match="positive finite number"):
        TrainConfig(lr=float("inf"))
    with pytest.raises(ConfigError, match=r"betas: two numbers in \[0, 1\)"):
        TrainConfig(betas=(1.0, 0.999))
    assert TrainConfig(optimizer="sgd", lr=1e38).lr == 1e38  # SGD steps by lr itself: representable


def test_region_inputs_take_numpy_and_refuse_inputs_for_different_image_counts(fixture_bert):
    model = xmatch.build(tiny_spec(fixture_bert)).eval()
    regions, boxes, mask = random_regions(3, 5, 12)
    with torch.no_grad():
        from_torch = model.encode_images(xmatch.RegionInputs(regions, boxes, mask))
        from_numpy = model.encode_images(xmatch.RegionInputs(regions.numpy(), boxes.numpy(), mask.numpy()))
    assert torch.equal(from_torch.tokens, from_numpy.tokens)
    with pytest.raises(ValueError, match=r"boxes must be \[batch, regions, 4\] = \(2, 5, 4\) to match the regions, got \(3, 5, 4\)"):
        xmatch.RegionInputs(regions[:2], boxes)
    with pytest.raises(ValueError, match=r"mask must be a bool tensor of shape \(3, 5\) .* got torch.bool \(2, 5\)"):
        xmatch.RegionInputs(regions, boxes, mask[:2])
    with pytest.raises(TypeError, match="regions and boxes must be torch tensors"):
        xmatch.RegionInputs(regions, boxes.tolist())
    with pytest.raises(TypeError, match=r"got Tensor: wrap region features as xmatch.RegionInputs\(regions, boxes, mask\)"):
        model.encode_images(regions)


# --- data paths and layouts ------------------------------------------------------------------------


def test_train_reports_a_missing_data_folder_before_any_model_is_built(tmp_path, capsys, monkeypatch):
    def no_build(*args, **kwargs):
        raise AssertionError("the model was built (weights fetched) before the data was checked")

    monkeypatch.setattr(xmatch, "build", no_build)
    missing = tmp_path / "no-such-data"
    assert main(["train", "teran-mrsw-coco", "--data", str(missing), "--dataset", "teran", "--out", str(tmp_path / "r")]) == 2
    assert str(missing) in capsys.readouterr().err


def test_without_dataset_the_layout_is_recognised_or_the_candidates_named(data_root, tmp_path, capsys):
    assert guess_layouts(data_root) == ["scan-precomp"]
    assert main(["eval", "tern-scenes", "--data", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "does not look like any registered dataset layout" in err and "scan-precomp" in err and "teran" in err
    (tmp_path / "scenes-small-224px-seed0-v1").mkdir()
    (tmp_path / "test.csv").write_text("image,caption\n")
    assert guess_layouts(tmp_path) == ["image-captions", "scenes"]
    assert main(["eval", "tern-scenes", "--data", str(tmp_path)]) == 2
    assert "looks like several dataset layouts (image-captions, scenes)" in capsys.readouterr().err


def test_a_mistyped_scenes_path_is_refused_instead_of_generating_a_new_set(tmp_path, capsys):
    typo = tmp_path / "scnes"
    with pytest.raises(FileNotFoundError, match=r"no scenes data at .*scnes: the folder does not exist"):
        open_dataset("scenes", typo, split="test", size="tiny")
    assert not typo.exists()
    other = tmp_path / "coco"
    (other / "annotations").mkdir(parents=True)
    assert main(["eval", "tern-scenes", "--dataset", "scenes", "--data", str(other), "--data-option", "size=tiny"]) == 2
    err = capsys.readouterr().err
    assert "holds no scene sets" in err and "generate=true" in err
    assert sorted(p.name for p in other.iterdir()) == ["annotations"]


def test_a_pixel_model_on_region_features_says_which_layout_to_use(data_root):
    class PixelEncoder:
        input_type = xmatch.PixelInputs

    class PixelModel:
        image_encoder = PixelEncoder()

    with pytest.raises(ValueError, match=r"takes pixels; .*--data-option layout=images"):
        check_images_fit(PixelModel(), small_data(data_root), "evaluation")
