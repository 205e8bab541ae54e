"""Modules that moved still import from their old paths, with a DeprecationWarning that names
the new path, and give the very same objects."""

from __future__ import annotations

import importlib
import warnings

import pytest

MOVED = [
    ("xmatch.data.scenes", "xmatch.scenes.dataset", "open_scenes"),
    ("xmatch.data.scenes", "xmatch.scenes.dataset", "KARPATHY_FILE"),
    ("xmatch.data.scenes_captions", "xmatch.scenes.captions", "describe"),
    ("xmatch.data.scenes_features", "xmatch.scenes.features", "pool_regions"),
    ("xmatch.data.scenes_render", "xmatch.scenes.render", "render"),
    ("xmatch.demo_draw", "xmatch.demo.draw", "draw_alignment"),
    ("xmatch.demo", "xmatch.demo.run", "token_labels"),
    ("xmatch.demo", "xmatch.demo.run", "prepare_scenes"),
    ("xmatch.zoo_params", "xmatch.model.parameter_counts", "count_parameters"),
    ("xmatch.zoo_params", "xmatch.model.parameter_counts", "write_bert_base_dir"),
    ("xmatch.components.image.timm_grid", "xmatch.components.image.backbone_weights", "PACKAGED_WEIGHTS"),
    ("xmatch.components.image.timm_grid", "xmatch.components.image.backbone_weights", "load_backbone_weights"),
    ("xmatch.components.image.timm_grid", "xmatch.components.image.backbone", "create_timm_model"),
    ("xmatch.components.image.timm_grid", "xmatch.components.image.backbone", "to_pil"),
]


@pytest.mark.parametrize(("old", "new", "name"), MOVED)
def test_an_old_path_warns_and_gives_the_same_object(old, new, name):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        value = getattr(importlib.import_module(old), name)
    assert value is getattr(importlib.import_module(new), name)
    messages = [str(w.message) for w in caught if w.category is DeprecationWarning]
    assert messages and f"import {name} from {new}" in messages[0]


def test_the_new_paths_import_without_warnings():
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        from xmatch.demo import draw, run, run_demo  # noqa: F401
        from xmatch.scenes import open_scenes  # noqa: F401


def test_an_unknown_name_on_an_old_path_is_an_attribute_error():
    import xmatch.data.scenes as old

    with pytest.raises(AttributeError, match="has no attribute 'no_such_name'"):
        old.no_such_name  # noqa: B018
    import xmatch.demo

    with pytest.raises(AttributeError, match="has no attribute '_write_grid'"):  # only the names that moved
        xmatch.demo._write_grid  # noqa: B018


def test_a_module_with_moved_and_renamed_names_serves_both():
    import xmatch.components.image.timm_grid as old

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert old.TimmGridEncoder is old.TimmGridImageEncoder  # renamed, not moved
        assert old.TimmBackbone.__module__ == "xmatch.components.image.backbone"  # used there: no warning
    assert [str(w.message).split(";")[0] for w in caught] == [
        "xmatch.components.image.timm_grid.TimmGridEncoder is now called TimmGridImageEncoder"
    ]
    with pytest.raises(AttributeError, match="has no attribute 'no_such_name'"):
        old.no_such_name  # noqa: B018
