"""Weights with NaN or infinite values are refused where they are loaded, with the tensor named
(issue 38): a bundle, a zoo-style weights file passed as a checkpoint, a trainer checkpoint's
weights and its optimizer state. ``XMATCH_ALLOW_NONFINITE_WEIGHTS=1`` (or
``load_weights(..., allow_nonfinite=True)``) loads them for research."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from safetensors import safe_open

import xmatch
from xmatch.io.bundle import ENV_ALLOW_NONFINITE, NonFiniteWeightsError, load_weights
from xmatch.train import checkpoint as ckpt

from conftest import tiny_spec
from test_run_folder_safety import data_root, train  # noqa: F401  (a fixture, and a short run in a run folder)


@pytest.fixture(scope="module")
def bundle(fixture_bert, tmp_path_factory) -> Path:
    torch.manual_seed(0)
    return xmatch.save_pretrained(xmatch.build(tiny_spec(fixture_bert)), tmp_path_factory.mktemp("b") / "tiny")


def poisoned(bundle: Path, where: Path, value: float, key: str | None = None) -> tuple[Path, str]:
    """A copy of ``bundle`` whose tensor ``key`` (default: the first floating one) holds ``value``."""
    shutil.copytree(bundle, where)
    weights = where / "model.safetensors"
    with safe_open(str(weights), framework="pt") as f:
        meta = f.metadata()
    tensors = load_file(str(weights))
    key = key or next(k for k, t in sorted(tensors.items()) if t.is_floating_point() and t.numel() > 1)
    tensors[key] = tensors[key].clone()
    tensors[key].view(-1)[1] = value
    save_file(tensors, str(weights), metadata=meta)
    return where, key


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_a_bundle_with_non_finite_weights_is_refused_with_the_tensor_named(bundle, tmp_path, value, monkeypatch):
    monkeypatch.delenv(ENV_ALLOW_NONFINITE, raising=False)
    folder, key = poisoned(bundle, tmp_path / "bad", value)
    with pytest.raises(NonFiniteWeightsError) as info:
        xmatch.build(f"local-dir:{folder}", pretrained=True)
    message = str(info.value)
    assert str(folder / "model.safetensors") in message and f"tensor '{key}'" in message
    assert ENV_ALLOW_NONFINITE in message
    # the same file passed as a checkpoint of the spec
    spec = xmatch.build(f"local-dir:{bundle}").spec
    with pytest.raises(NonFiniteWeightsError, match=f"tensor '{key}'"):
        xmatch.build(spec, checkpoint=folder / "model.safetensors")


def test_the_opt_out_loads_them_for_research(bundle, tmp_path, monkeypatch):
    folder, key = poisoned(bundle, tmp_path / "bad", float("nan"))
    model = xmatch.build(f"local-dir:{bundle}")
    load_weights(model, folder / "model.safetensors", allow_nonfinite=True)
    assert torch.isnan(model.state_dict()[key]).any()
    with pytest.raises(NonFiniteWeightsError):
        load_weights(model, folder / "model.safetensors", allow_nonfinite=False)
    monkeypatch.setenv(ENV_ALLOW_NONFINITE, "1")
    loaded = xmatch.build(f"local-dir:{folder}", pretrained=True)
    assert torch.isnan(loaded.state_dict()[key]).any()


def test_finite_weights_load_as_before(bundle, monkeypatch):
    monkeypatch.delenv(ENV_ALLOW_NONFINITE, raising=False)
    model = xmatch.build(f"local-dir:{bundle}", pretrained=True)
    assert all(torch.isfinite(t).all() for t in model.state_dict().values() if t.is_floating_point())


@pytest.mark.parametrize("part", ["weights", "optimizer"])
def test_a_checkpoint_with_non_finite_values_is_named_and_the_previous_one_used(
    fixture_bert, data_root, tmp_path, caplog, monkeypatch, part
):
    monkeypatch.delenv(ENV_ALLOW_NONFINITE, raising=False)
    train(fixture_bert, data_root, tmp_path, config={"max_steps": 3})
    latest = tmp_path / "checkpoints" / "step-00000003"
    if part == "weights":
        weights = latest / "model.safetensors"
        with safe_open(str(weights), framework="pt") as f:
            meta = f.metadata()
        tensors = load_file(str(weights))
        key = next(k for k, t in sorted(tensors.items()) if t.is_floating_point())
        tensors[key] = torch.full_like(tensors[key], float("nan"))
        save_file(tensors, str(weights), metadata=meta)
        named = f"tensor '{key}'"
    else:
        state = torch.load(latest / ckpt.STATE_FILE, weights_only=True)
        moments = state["optimizer"]["state"][0]
        moments["exp_avg"] = torch.full_like(moments["exp_avg"], float("inf"))
        torch.save(state, latest / ckpt.STATE_FILE)
        named = "tensor 'optimizer.state.0.exp_avg'"
    model = xmatch.build(xmatch.build(f"local-dir:{latest}").spec)
    with pytest.raises(ckpt.CheckpointError, match="non-finite") as info:
        ckpt.read_checkpoint(latest, model)
    assert named in str(info.value)
    with caplog.at_level(logging.WARNING, logger="xmatch.train.trainer"):
        train(fixture_bert, data_root, tmp_path, resume=True, config={"max_steps": 4})
    assert named in caplog.text and "falling back to the previous kept checkpoint" in caplog.text
