"""``build(model, pretrained, checkpoint)`` means the same for every kind of name: ``False``
(the default) loads no weights (a ``local-dir:`` or ``hf-hub:`` bundle included), ``True`` the
name's own weights, ``checkpoint=PATH`` that file; each argument has one meaning."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch

import xmatch
from xmatch.io import hub
from xmatch.core.registry import models
from xmatch.core.spec import SpecError
from xmatch.model.factory import is_bundle_name

from conftest import tiny_spec

pytestmark = pytest.mark.cpu_kernels  # floats from the CPU's kernels against stored ones (docs/testing.md)


@pytest.fixture(scope="module")
def trained(fixture_bert, tmp_path_factory):
    """A saved bundle whose weights differ from a fresh build of its spec: (model, directory)."""
    torch.manual_seed(0)
    model = xmatch.build(tiny_spec(fixture_bert)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)  # no random initialisation gives these
    return model, xmatch.save_pretrained(model, tmp_path_factory.mktemp("bundle") / "tiny")


@pytest.fixture
def zoo_entry_with_weights(trained, fixture_bert):
    """A zoo entry registered for this test whose published weights are the bundle."""
    _, directory = trained
    with models.restored():
        models.register("test-entry-with-weights", xmatch.ZooEntry(
            name="test-entry-with-weights", spec=tiny_spec(fixture_bert), weights=[{"source": str(directory)}]))
        yield "test-entry-with-weights"


def same_weights(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


@pytest.fixture
def hf_bundle(trained, monkeypatch):
    """``hf-hub:org/tiny`` served from the local bundle (what huggingface_hub would download)."""
    _, directory = trained
    fetched = []

    def fetch(source, **_):
        fetched.append(source)
        assert source == "hf-hub:org/tiny"
        return directory

    monkeypatch.setattr(hub, "fetch", fetch)
    return fetched


@pytest.mark.parametrize("kind", ["local-dir", "hf-hub"])
def test_pretrained_false_loads_no_weights_for_a_bundle(kind, trained, hf_bundle, caplog):
    model, directory = trained
    name = f"local-dir:{directory}" if kind == "local-dir" else "hf-hub:org/tiny"
    with warnings.catch_warnings(), caplog.at_level("WARNING", logger="xmatch"):
        warnings.simplefilter("error")  # timm's rule, no Python warning: only a log line names the way to the weights
        fresh = xmatch.build(name, pretrained=False)
        default = xmatch.build(name)
    said = [r.getMessage() for r in caplog.records if "random weights" in r.getMessage()]
    assert len(said) == 2 and f"build('{name}', pretrained=True)" in said[0]
    caplog.clear()
    with caplog.at_level("WARNING", logger="xmatch"):
        assert fresh.spec == default.spec == xmatch.build(name, pretrained=True).spec
    assert not [r for r in caplog.records if "random weights" in r.getMessage()]
    assert not same_weights(fresh, model) and not same_weights(default, model)
    assert same_weights(xmatch.build(name, pretrained=True), model)


def test_a_zoo_entry_loads_its_weights_only_with_pretrained_true(trained, zoo_entry_with_weights):
    model, _ = trained
    assert same_weights(xmatch.build(zoo_entry_with_weights, pretrained=True), model)
    assert not same_weights(xmatch.build(zoo_entry_with_weights, pretrained=False), model)
    assert not same_weights(xmatch.build(zoo_entry_with_weights), model)


def test_pretrained_true_on_a_spec_is_an_error(fixture_bert):
    with pytest.raises(ValueError, match="spec without weights"):
        xmatch.build(tiny_spec(fixture_bert), pretrained=True)


def test_is_bundle_name_says_which_names_carry_their_own_weights(trained, fixture_bert):
    _, directory = trained
    assert is_bundle_name(f"local-dir:{directory}") and is_bundle_name("hf-hub:org/tiny")
    assert not is_bundle_name("teran-mrsw-coco") and not is_bundle_name(tiny_spec(fixture_bert))


def test_a_checkpoint_given_with_a_bundle_name_is_loaded(trained, fixture_bert, tmp_path):
    model, directory = trained
    torch.manual_seed(1)
    other = xmatch.save_pretrained(xmatch.build(tiny_spec(fixture_bert)), tmp_path / "other")
    built = xmatch.build(f"local-dir:{directory}", checkpoint=other / "model.safetensors")
    assert same_weights(built, xmatch.build(f"local-dir:{other}", pretrained=True))
    assert not same_weights(built, model)


def test_a_checkpoint_on_a_spec_is_loaded(trained, fixture_bert):
    model, directory = trained
    built = xmatch.build(tiny_spec(fixture_bert), checkpoint=str(directory / "model.safetensors"))
    assert same_weights(built, model)
    assert same_weights(xmatch.build(tiny_spec(fixture_bert), False, directory / "model.safetensors"), model)


@pytest.mark.parametrize("value, message", [
    ("model_best.pth", r"pretrained is True or False, got 'model_best.pth': load a weights file with "
                       r"checkpoint='model_best.pth'; pretrained=True loads the zoo entry's or the bundle's own weights"),
    ("bundle", r"got 'bundle': load a weights file with checkpoint=PATH; pretrained=True loads"),
    (None, "pretrained is True or False, got None"),
    (1, r"got 1: load a weights file with checkpoint=PATH"),
])
def test_a_pretrained_value_that_is_not_a_bool_names_checkpoint(value, message, monkeypatch):
    monkeypatch.setattr(xmatch.model.factory, "model_from_spec", lambda spec: pytest.fail("built"))
    with pytest.raises(TypeError, match=message):
        xmatch.build("teran-mrsw-coco", pretrained=value)
    with pytest.raises(TypeError, match="pretrained is True or False"):
        xmatch.build("teran-mrsw-coco", Path("model_best.pth"))  # the second positional is pretrained


def test_pretrained_true_with_a_checkpoint_says_to_pick_one(monkeypatch, trained):
    monkeypatch.setattr(xmatch.model.factory, "model_from_spec", lambda spec: pytest.fail("built"))
    _, directory = trained
    with pytest.raises(ValueError, match=r"pretrained=True and checkpoint= both name weights to load; pick one"):
        xmatch.build(f"local-dir:{directory}", pretrained=True, checkpoint=directory / "model.safetensors")


@pytest.mark.parametrize("value, error, message", [
    ("weights.bin", ValueError, r"checkpoint='weights.bin': expected a \.safetensors file or an original \.pth checkpoint \(TERN/TERAN's"),
    ("auto", ValueError, "expected a .safetensors file"),
    (1, TypeError, "checkpoint is a path to a weights file, got int"),
])
def test_bad_checkpoint_values_are_refused_before_anything_is_built(value, error, message, monkeypatch):
    monkeypatch.setattr(xmatch.model.factory, "model_from_spec", lambda spec: pytest.fail("built"))
    with pytest.raises(error, match=message):
        xmatch.build("teran-mrsw-coco", checkpoint=value)


@pytest.mark.parametrize("path", ["model_best.pth", "runs/x/model.safetensors"])
def test_a_weights_file_as_the_model_says_to_pass_it_as_checkpoint(path):
    with pytest.raises(SpecError, match=rf"weights file, not a model.*checkpoint='{path}'"):
        xmatch.build(path)


def test_an_unknown_name_is_a_spec_error_and_an_xmatch_error():
    with pytest.raises(xmatch.XmatchError, match="Did you mean") as info:
        xmatch.build("teran-mrsw-cocoo")
    assert isinstance(info.value, SpecError) and isinstance(info.value, ValueError)


def test_an_original_checkpoint_is_checked_against_the_zoo_name(mrsw_small):
    """A .pth together with a zoo name must convert to the model the name describes."""
    with pytest.raises(ValueError, match=r"does not convert to the model 'tern-coco' describes"):
        xmatch.build("tern-coco", checkpoint=mrsw_small / "checkpoint.pth")
    with pytest.raises(ValueError, match=r"does not convert to the model 'tern-coco' describes"):
        xmatch.build("tern-coco", checkpoint=str(mrsw_small / "checkpoint.pth"), pooler={"name": "global-cosine"})
