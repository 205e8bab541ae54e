"""One naming scheme across components: ``backbone`` chooses a pretrained network and
``weights`` a weights file, in every component; a component class is ``<Name><Kind>``. A spec
written with a name used before is refused, and the error lists the arguments there are."""

from __future__ import annotations

import inspect

import pytest

import xmatch
from xmatch.core.registry import get_registry
from xmatch.core.spec import SpecError, check_component, signature_of

#: (registry kind, component name, the argument's name before, its name now)
OLD_ARGUMENTS = [
    ("image_encoders", "timm-grid", "model", "backbone"),
    ("text_encoders", "bert", "source", "backbone"),
    ("proposers", "torchvision-detector", "model", "backbone"),
]


@pytest.mark.parametrize("kind, name, old, new", OLD_ARGUMENTS)
def test_an_old_argument_name_is_refused_with_the_arguments_listed(kind, name, old, new):
    path = f"model -> {kind[:-1]}"
    with pytest.raises(SpecError, match=rf"{path} -> {old}: '{name}' has no argument '{old}'\. Arguments: {new}, "):
        check_component({"name": name, old: "x"}, kind, path)
    assert check_component({"name": name, new: "x"}, kind, path)[new] == "x"


def test_every_backbone_and_weights_argument_has_one_name():
    """No registered component takes the old spellings any more."""
    old_names = {"model", "source", "checkpoint", "model_name"}
    for kind in ("image_encoders", "text_encoders"):
        registry = get_registry(kind)
        for name in registry.names():
            params = set(signature_of(registry.get(name)).parameters)
            assert not params & old_names, f"{kind} '{name}' still takes {sorted(params & old_names)}"


def test_zoo_specs_use_the_new_names():
    for entry in xmatch.list_models():
        spec = xmatch.info(entry).spec
        for key in ("image_encoder", "text_encoder"):
            check_component(spec[key], f"{key}s", f"{entry} -> {key}")


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
