"""``build(..., pretrained=...)`` means the same for every kind of name: ``False`` loads no
weights (a ``local-dir:`` or ``hf-hub:`` bundle included), ``True`` the name's weights,
``"bundle"`` a bundle's own weights and none for anything else, a path that file."""

from __future__ import annotations

import warnings

import pytest
import torch

import xmatch
from xmatch.io import hub
from xmatch.core.registry import models
from xmatch.core.spec import SpecError

from conftest import tiny_spec


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
def zoo_entry_with_weights(trained, fixture_bert, monkeypatch):
    """A zoo entry registered for this test whose published weights are the bundle."""
    _, directory = trained
    monkeypatch.setattr(models, "_names", dict(models._names))
    monkeypatch.setattr(models, "_origin", dict(models._origin))
    models.register("test-entry-with-weights", xmatch.ZooEntry(
        name="test-entry-with-weights", spec=tiny_spec(fixture_bert), weights=[{"source": str(directory)}]))
    return "test-entry-with-weights"


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
def test_pretrained_false_loads_no_weights_for_a_bundle(kind, trained, hf_bundle):
    model, directory = trained
    name = f"local-dir:{directory}" if kind == "local-dir" else "hf-hub:org/tiny"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an explicit False is not warned about
        fresh = xmatch.build(name, pretrained=False)
    assert fresh.spec == xmatch.build(name, pretrained=True).spec
    assert not same_weights(fresh, model)
    assert same_weights(xmatch.build(name, pretrained=True), model)
    assert same_weights(xmatch.build(name, pretrained="bundle"), model)


@pytest.mark.parametrize("kind", ["local-dir", "hf-hub"])
def test_the_default_loads_no_weights_and_warns_for_a_bundle(kind, trained, hf_bundle):
    model, directory = trained
    name = f"local-dir:{directory}" if kind == "local-dir" else "hf-hub:org/tiny"
    with pytest.warns(UserWarning, match=r"random weights.*pretrained=True for its weights"):
        fresh = xmatch.build(name)
    assert not same_weights(fresh, model)


def test_zoo_names_and_specs_are_not_warned_about(fixture_bert, zoo_entry_with_weights):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        xmatch.build(zoo_entry_with_weights)
        xmatch.build(tiny_spec(fixture_bert))


def test_a_zoo_entry_loads_its_weights_only_with_pretrained_true(trained, zoo_entry_with_weights):
    model, _ = trained
    assert same_weights(xmatch.build(zoo_entry_with_weights, pretrained=True), model)
    assert not same_weights(xmatch.build(zoo_entry_with_weights, pretrained=False), model)
    # "bundle" is the old default: a bundle's own weights, never a zoo entry's
    assert not same_weights(xmatch.build(zoo_entry_with_weights, pretrained="bundle"), model)


def test_pretrained_true_on_a_spec_is_an_error_and_bundle_is_random(fixture_bert):
    with pytest.raises(ValueError, match="spec without weights"):
        xmatch.build(tiny_spec(fixture_bert), pretrained=True)
    xmatch.build(tiny_spec(fixture_bert), pretrained="bundle")


def test_a_weights_file_given_with_a_bundle_name_is_loaded(trained, fixture_bert, tmp_path):
    model, directory = trained
    torch.manual_seed(1)
    other = xmatch.save_pretrained(xmatch.build(tiny_spec(fixture_bert)), tmp_path / "other")
    built = xmatch.build(f"local-dir:{directory}", pretrained=other / "model.safetensors")
    assert same_weights(built, xmatch.build(f"local-dir:{other}", pretrained=True))
    assert not same_weights(built, model)


@pytest.mark.parametrize("value, error, message", [
    ("weights.bin", ValueError, r"expected a \.safetensors file or an original \.pth checkpoint \(or True, False, 'bundle'\)"),
    ("auto", ValueError, "expected a .safetensors file"),
    (1, TypeError, "pretrained must be True, False, 'bundle' or a path"),
])
def test_bad_pretrained_values_are_refused_before_anything_is_built(value, error, message, monkeypatch):
    monkeypatch.setattr(xmatch.model.factory, "model_from_spec", lambda spec: pytest.fail("built"))
    with pytest.raises(error, match=message):
        xmatch.build("teran-mrsw-coco", pretrained=value)


@pytest.mark.parametrize("path", ["model_best.pth", "runs/x/model.safetensors"])
def test_a_weights_file_as_the_model_says_to_pass_it_as_pretrained(path):
    with pytest.raises(SpecError, match=rf"weights file, not a model.*pretrained='{path}'"):
        xmatch.build(path)


def test_an_unknown_name_is_a_spec_error_and_an_xmatch_error():
    with pytest.raises(xmatch.XmatchError, match="Did you mean") as info:
        xmatch.build("teran-mrsw-cocoo")
    assert isinstance(info.value, SpecError) and isinstance(info.value, ValueError)


def test_an_original_checkpoint_is_checked_against_the_zoo_name(mrsw_small):
    """A .pth together with a zoo name must convert to the model the name describes."""
    with pytest.raises(ValueError, match=r"does not convert to the model 'tern-coco' describes"):
        xmatch.build("tern-coco", pretrained=mrsw_small / "checkpoint.pth")
    with pytest.raises(ValueError, match=r"does not convert to the model 'tern-coco' describes"):
        xmatch.build("tern-coco", pretrained=str(mrsw_small / "checkpoint.pth"), pooler={"name": "global-cosine"})
