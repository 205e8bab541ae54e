"""Absurd sizes in a spec (or in a backbone's config) are a ``SpecError`` that names the value, the
parameters and bytes it would need and the bound, found on the meta device before anything is
allocated; normal specs build as before."""

from __future__ import annotations

import json
import re
import shutil

import pytest
import torch

import xmatch
from xmatch import SpecError
from xmatch.model import factory, sizes

from conftest import tiny_spec


@pytest.fixture
def devices_built(monkeypatch) -> list[str]:
    """The default device of every model assembly: 'meta' for the size check's dry run."""
    built: list[str] = []
    assemble = factory.assemble_model

    def recording(canonical):
        built.append(torch.get_default_device().type)
        return assemble(canonical)

    monkeypatch.setattr(factory, "assemble_model", recording)
    return built


# (override, the value the message names, the bytes it shows)
ABSURD = [
    ({"embed_dim": 10**7}, r"model -> embed_dim = 10,000,000", r"\(\d.* PiB\)"),
    ({"image_reasoner": {"ff_dim": 10**9}}, r"model -> image_reasoner -> ff_dim = 1,000,000,000", r"\(\d.* GiB\)"),
    ({"image_encoder": {"feature_dim": 10**6}}, r"model -> image_encoder -> feature_dim = 1,000,000", r"TiB"),
    ({"image_encoder": {"ff_dim": 10**9}}, r"model -> image_encoder -> ff_dim = 1,000,000,000", r"GiB"),
    ({"text_reasoner": {"ff_dim": 3 * 10**9}}, r"model -> text_reasoner -> ff_dim = 3,000,000,000", r"GiB"),
]


@pytest.mark.parametrize("override, value, size", ABSURD, ids=lambda x: str(x)[:40])
def test_an_absurd_size_is_refused_before_anything_is_allocated(fixture_bert, devices_built, override, value, size):
    spec = xmatch.core.spec.merge(tiny_spec(fixture_bert), override)
    with pytest.raises(SpecError) as info:
        xmatch.build(spec)
    message = str(info.value)
    assert re.match(value + ": the model would hold [\\d,]+ parameters and buffers", message), message
    assert re.search(size, message) and "more than the 16 GiB a model may take" in message
    assert "its largest tensor" in message
    assert devices_built == ["meta"]


def test_a_size_torch_cannot_represent_names_the_value(fixture_bert, devices_built):
    with pytest.raises(SpecError, match=r"^model -> embed_dim = 1,000,000,000,000: torch cannot size a tensor .*overflow"):
        xmatch.build(tiny_spec(fixture_bert, embed_dim=10**12))
    spec = tiny_spec(fixture_bert)
    spec["text_reasoner"]["ff_dim"] = -5
    with pytest.raises(SpecError, match=r"^model -> text_reasoner -> ff_dim = -5: .*negative dimension.*positive whole number"):
        xmatch.build(spec)
    assert devices_built == ["meta", "meta"]


def test_layers_are_bounded_before_the_dry_run(fixture_bert, devices_built):
    spec = tiny_spec(fixture_bert)
    spec["image_reasoner"]["layers"] = 10**6
    with pytest.raises(SpecError, match=r"model -> image_reasoner -> layers = 1,000,000: more than the 1,024 layers"):
        xmatch.build(spec)
    assert devices_built == []


def test_heads_that_do_not_divide_the_width_are_a_spec_error(fixture_bert):
    spec = tiny_spec(fixture_bert)
    spec["image_reasoner"]["heads"] = 10**7
    with pytest.raises(SpecError, match=r"model -> image_reasoner \(transformer\): .*not divisible by heads 10000000"):
        xmatch.build(spec)


def test_a_vocabulary_from_a_backbone_config_is_counted_too(fixture_bert, tmp_path, devices_built):
    # the size comes from a file, not the spec: the message names the component and its tensor
    directory = tmp_path / "bert"
    shutil.copytree(fixture_bert, directory)
    config = json.loads((directory / "config.json").read_text(encoding="utf-8"))
    (directory / "config.json").write_text(json.dumps({**config, "vocab_size": 10**10}), encoding="utf-8")
    with pytest.raises(SpecError) as info:
        xmatch.build(tiny_spec(str(directory)))
    message = str(info.value)
    assert message.startswith("model -> text_encoder (bert) with layers = 1: the model would hold")
    assert f"its largest tensor 10,000,000,000 x {config['hidden_size']}" in message
    assert devices_built == ["meta"]


def test_the_bound_is_on_the_whole_model(fixture_bert, monkeypatch):
    normal = xmatch.build(tiny_spec(fixture_bert))
    tensors = {id(t): t for t in [*normal.parameters(), *normal.buffers()]}.values()
    need = sum(t.numel() * t.element_size() for t in tensors)
    monkeypatch.setattr(sizes, "MAX_MODEL_BYTES", need - 1)
    with pytest.raises(SpecError, match=rf"would hold {sum(t.numel() for t in tensors):,} parameters and buffers"):
        xmatch.build(tiny_spec(fixture_bert))
    monkeypatch.setattr(sizes, "MAX_MODEL_BYTES", need)
    xmatch.build(tiny_spec(fixture_bert))


def test_normal_specs_build_once_after_the_dry_run(fixture_bert, devices_built):
    net = xmatch.build(tiny_spec(fixture_bert))
    assert devices_built == ["meta", "cpu"] and next(net.parameters()).device.type == "cpu"
    with torch.device("meta"):  # shapes only already (parameter counts): no second dry run
        xmatch.build(tiny_spec(fixture_bert))
    assert devices_built == ["meta", "cpu", "meta"]


def test_a_pretrained_backbone_is_not_loaded_by_the_dry_run(fixture_bert, tmp_path, devices_built):
    from transformers import AutoConfig, AutoModel

    directory = tmp_path / "bert"
    shutil.copytree(fixture_bert, directory)
    torch.manual_seed(0)
    saved = AutoModel.from_config(AutoConfig.from_pretrained(directory), add_pooling_layer=False)
    saved.save_pretrained(directory)
    spec = tiny_spec(str(directory))
    spec["text_encoder"].update(pretrained=True, layers=None)
    net = xmatch.build(spec)
    assert devices_built == ["meta", "cpu"]
    loaded = net.text_encoder.model.embeddings.word_embeddings.weight
    assert torch.equal(loaded, saved.embeddings.word_embeddings.weight)
