"""Specs: validation against builder signatures, error paths, overrides, round trips."""

from __future__ import annotations

import pytest
import tomli_w
import torch

import xmatch
from xmatch import SpecError
from xmatch.core.spec import merge

from conftest import tiny_spec


def test_unknown_component_names_the_path_and_close_matches(fixture_bert):
    spec = tiny_spec(fixture_bert, pooler="MrSv")
    with pytest.raises(SpecError, match=r"model -> pooler -> name: .*Did you mean: 'MrSw'"):
        xmatch.build(spec)


def test_unknown_argument_names_the_path_and_close_matches(fixture_bert):
    spec = tiny_spec(fixture_bert)
    spec["image_encoder"]["layer"] = 2
    with pytest.raises(SpecError, match=r"model -> image_encoder -> layer: .*Did you mean 'layers'"):
        xmatch.build(spec)


def test_wrong_type_and_missing_tables(fixture_bert):
    spec = tiny_spec(fixture_bert)
    spec["loss"]["margin"] = "0.2"
    with pytest.raises(SpecError, match=r"model -> loss -> margin: expected float"):
        xmatch.build(spec)
    spec = tiny_spec(fixture_bert)
    del spec["pooler"]
    with pytest.raises(SpecError, match=r"model -> pooler: missing"):
        xmatch.build(spec)
    with pytest.raises(SpecError, match=r"model -> poler: unknown key. Did you mean 'pooler'"):
        xmatch.build({**tiny_spec(fixture_bert), "poler": {}})
    spec = tiny_spec(fixture_bert)
    spec["image_reasoner"]["dim"] = 8
    with pytest.raises(SpecError, match="set by the model builder"):
        xmatch.build(spec)


def test_nothing_is_built_when_a_later_table_is_wrong(fixture_bert, monkeypatch):
    built = []
    monkeypatch.setattr(xmatch.core.spec, "instantiate", lambda *a, **k: built.append(a))
    spec = tiny_spec(fixture_bert)
    spec["loss"]["bogus"] = 1
    with pytest.raises(SpecError):
        xmatch.build(spec)
    assert built == []


def test_component_errors_carry_the_path(fixture_bert):
    spec = tiny_spec(fixture_bert)
    spec["image_reasoner"]["heads"] = 5  # 16 is not divisible by 5
    with pytest.raises(SpecError, match=r"model -> image_reasoner \(transformer\): .*divisible"):
        xmatch.build(spec)


def test_merge_replaces_a_renamed_component_and_merges_otherwise():
    base = {"pooler": {"name": "MrSw", "compat": "original"}, "embed_dim": 8}
    assert merge(base, {"pooler": {"name": "Symm"}})["pooler"] == {"name": "Symm"}
    assert merge(base, {"pooler": {"compat": "clean"}})["pooler"] == {"name": "MrSw", "compat": "clean"}
    assert merge(base, {"pooler": {"name": "mrsw", "compat": "clean"}})["pooler"]["compat"] == "clean"


def test_spec_is_recoverable_and_rebuilds_the_same_architecture(fixture_bert):
    model = xmatch.build(tiny_spec(fixture_bert))
    spec = model.spec
    assert spec["pooler"] == {"name": "MrSw", "compat": "clean", "region_slots": 36, "word_slots": 85}
    assert spec["image_encoder"]["cls_slot"] is True  # defaults are filled in
    again = xmatch.build(spec)
    assert again.spec == spec
    assert {k: v.shape for k, v in again.state_dict().items()} == {k: v.shape for k, v in model.state_dict().items()}


def test_toml_file_and_nested_overrides(fixture_bert, tmp_path):
    path = tmp_path / "model.toml"
    path.write_text(tomli_w.dumps(tiny_spec(fixture_bert)))
    model = xmatch.build(path, pooler={"name": "Symm"}, embed_dim=24)
    assert model.spec["pooler"]["name"] == "Symm" and model.embed_dim == 24
    assert type(model.pooler).__name__ == "SymmPooler"
    with pytest.raises(SpecError, match="not valid TOML"):
        (tmp_path / "bad.toml").write_text("embed_dim = = 3")
        xmatch.build(tmp_path / "bad.toml")


def test_shared_reasoner_is_one_instance(fixture_bert):
    spec = tiny_spec(fixture_bert, shared_reasoner=True)
    del spec["text_reasoner"]
    model = xmatch.build(spec)
    assert model.image_reasoner is model.text_reasoner
    assert "text_reasoner" not in model.spec
    # the same table twice is accepted (zoo bases define both)
    model = xmatch.build(tiny_spec(fixture_bert, shared_reasoner=True))
    assert model.image_reasoner is model.text_reasoner
    bad = tiny_spec(fixture_bert, shared_reasoner=True)
    bad["text_reasoner"]["layers"] = 3
    with pytest.raises(SpecError, match="shared_reasoner"):
        xmatch.build(bad)


def test_build_rejects_directories_and_unknown_names(tmp_path):
    with pytest.raises(ValueError, match="local-dir:"):
        xmatch.build(str(tmp_path))
    with pytest.raises(ValueError, match="Did you mean: 'teran-mrsw-coco'"):
        xmatch.build("teran-mrsw-cocoo")


def test_device_and_dtype(fixture_bert):
    model = xmatch.build(tiny_spec(fixture_bert), dtype=torch.float64)
    assert model.dtype == torch.float64


def test_a_whole_number_float_for_an_int_is_a_type_error_that_says_how_to_write_it(fixture_bert):
    with pytest.raises(SpecError, match=r"^model -> embed_dim: expected int, got 10000000.0. Write 10000000: an int has no"):
        xmatch.build(tiny_spec(fixture_bert, embed_dim=1e7))
    spec = tiny_spec(fixture_bert)
    spec["image_reasoner"]["ff_dim"] = 1e7
    with pytest.raises(SpecError, match=r"^model -> image_reasoner -> ff_dim: expected int, got 10000000.0. Write 10000000"):
        xmatch.build(spec)
    spec["image_reasoner"]["ff_dim"] = 32.5
    with pytest.raises(SpecError, match=r"expected int, got 32.5.$"):
        xmatch.build(spec)
    spec = tiny_spec(fixture_bert)
    spec["text_encoder"]["layers"] = 1.0  # int | None
    with pytest.raises(SpecError, match=r"text_encoder -> layers: expected int \| None, got 1.0. Write 1:"):
        xmatch.build(spec)
