"""The BERT backbone of the TERAN and TERN zoo entries is pinned like every hub reference of a
zoo entry: ``hf-hub:google-bert/bert-base-uncased@COMMIT``, fetched into xmatch's cache and
checked against the names the Hub gave its files (a local Hub emulator serves a tiny BERT)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import xmatch
from xmatch.components.text.bert import BackboneLoadError, BertTextEncoder
from xmatch.core.sources import BERT_BASE_UNCASED, parse_hf_source, unpinned_problem
from xmatch.io import hub
from xmatch.model.convert import resolve_bert_source

from hub_emulator import HubEmulator, hub_emulator  # noqa: F401  (a fixture)

COMMIT = "ab" * 20


def tiny_bert_files(fixture_bert: str, folder: Path) -> dict[str, bytes]:
    """A tiny random BERT as its hub repository holds it: config, tokenizer files and model.safetensors."""
    from transformers import AutoConfig, AutoModel

    torch.manual_seed(0)
    AutoModel.from_config(AutoConfig.from_pretrained(fixture_bert)).save_pretrained(folder)
    files = {p.name: p.read_bytes() for p in Path(fixture_bert).iterdir() if p.is_file()}
    return {**files, "config.json": (folder / "config.json").read_bytes(),
            "model.safetensors": (folder / "model.safetensors").read_bytes()}


def serve(emulator: HubEmulator, fixture_bert: str, tmp_path: Path) -> tuple[str, dict[str, bytes]]:
    files = tiny_bert_files(fixture_bert, tmp_path / "upstream")
    emulator.add_commit("org/tiny-bert", COMMIT, files)
    return f"hf-hub:org/tiny-bert@{COMMIT}", files


def test_every_bert_backbone_of_the_zoo_is_pinned_to_a_commit():
    bert = [n for n in xmatch.list_models() if xmatch.info(n).spec.get("text_encoder", {}).get("name") == "bert"]
    assert len(bert) >= 10
    for name in bert:
        backbone = xmatch.info(name).spec["text_encoder"]["backbone"]
        assert backbone.startswith(("hf-hub:", "zoo:", "package:")), (name, backbone)
        if backbone.startswith("hf-hub:"):
            assert unpinned_problem(backbone) is None, (name, backbone)
    assert parse_hf_source(BERT_BASE_UNCASED)[:2] == ("google-bert/bert-base-uncased", "86b5e0934494bd15c9632b12f734a8a67f723594")


def test_a_pinned_hub_backbone_loads_its_weights_and_then_loads_offline(hub_emulator, fixture_bert, tmp_path, monkeypatch):  # noqa: F811
    source, files = serve(hub_emulator, fixture_bert, tmp_path)
    encoder = BertTextEncoder(source, layers=1)
    stored = load_file(str(tmp_path / "upstream" / "model.safetensors"))
    got = encoder.model.state_dict()
    assert got and all(torch.equal(got[k], stored[k]) for k in got if k in stored)
    assert encoder.tokenize(["a dog on a bench"]).mask.shape[0] == 1
    monkeypatch.setenv("XMATCH_OFFLINE", "1")
    monkeypatch.setattr(hub, "_DIGESTS", {})
    again = BertTextEncoder(source, layers=1)
    assert all(torch.equal(again.model.state_dict()[k], v) for k, v in got.items())
    with pytest.raises(BackboneLoadError, match="offline, and 'hf-hub:org/other-bert@"):
        BertTextEncoder(f"hf-hub:org/other-bert@{COMMIT}", layers=1)


def test_without_pretrained_weights_only_the_config_and_tokenizer_are_fetched(hub_emulator, fixture_bert, tmp_path):  # noqa: F811
    source, _ = serve(hub_emulator, fixture_bert, tmp_path)
    BertTextEncoder(source, layers=1, pretrained=False)
    fetched = {r.path.rsplit("/", 1)[-1] for r in hub_emulator.requests if "/resolve/" in r.path}
    assert "config.json" in fetched and "model.safetensors" not in fetched


def test_a_tampered_backbone_file_is_refused_and_not_kept(hub_emulator, fixture_bert, tmp_path):  # noqa: F811
    source, files = serve(hub_emulator, fixture_bert, tmp_path)
    damaged = bytearray(files["model.safetensors"])
    damaged[-1] ^= 0xFF
    hub_emulator.tamper("org/tiny-bert", COMMIT, "model.safetensors", bytes(damaged))
    with pytest.raises(hub.ChecksumError, match="model.safetensors"):
        BertTextEncoder(source, layers=1)
    cache = Path(hub.cache_dir()) / "huggingface"
    assert not [p for p in cache.rglob("model.safetensors") if p.exists()]


def test_the_converter_takes_the_pinned_bert_base_when_no_folder_is_beside_the_checkpoint(tmp_path):
    config = {"text-model": {"pretrain": "bert-base-uncased"}, "image-model": {}, "model": {"name": "tern"}, "training": {}}
    checkpoint = tmp_path / "model_best.pth"
    assert resolve_bert_source(checkpoint, config, None) == BERT_BASE_UNCASED
    (tmp_path / "bert-base-uncased").mkdir()
    assert resolve_bert_source(checkpoint, config, None) == str(tmp_path / "bert-base-uncased")
    assert resolve_bert_source(checkpoint, config, "mine") == "mine"
