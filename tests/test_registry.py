"""Registries: duplicates, case-insensitive lookup, close matches, entry-point plugins."""

from __future__ import annotations

import sys
import textwrap

import pytest

import xmatch
from xmatch.registry import Registry, RegistryError, get_registry


def test_every_kind_has_a_registry_and_decorator():
    for kind in ("image_encoders", "text_encoders", "reasoners", "poolers", "losses", "models", "datasets"):
        assert get_registry(kind).entry_point_group == f"xmatch_{kind}"
    # installed plugins (plugins/) add their own poolers: look at xmatch's
    builtin = [n for n in xmatch.list_components("poolers") if xmatch.registry.poolers.origin(n) == "xmatch"]
    assert builtin == ["global-cosine", "MrAvgw", "MrSw", "MwSr", "Symm"]
    assert {"bert", "bigru", "bilstm"} <= set(xmatch.list_components("text_encoders"))


def test_lookup_is_case_insensitive():
    assert xmatch.registry.poolers.get("mrsw") is xmatch.registry.poolers.get("MrSw")
    assert xmatch.registry.poolers.canonical("SYMM") == "Symm"


def test_duplicates_raise():
    reg = Registry("test_dupes")
    reg.register("Thing", object())
    with pytest.raises(RegistryError, match="already registered"):
        reg.register("thing", object())
    with pytest.raises(RegistryError, match="already registered"):
        xmatch.register_pooler("mrsw")(type("Other", (xmatch.Pooler,), {}))


def test_unknown_name_lists_close_matches_and_plugin_hint():
    with pytest.raises(RegistryError) as err:
        xmatch.registry.poolers.get("MrSW2")
    assert "Did you mean: 'MrSw'" in str(err.value) and "Available:" in str(err.value)
    with pytest.raises(RegistryError, match="pip install xmatch-scan"):
        xmatch.registry.poolers.get("scan-nothing")
    with pytest.raises(RegistryError, match="entry-point group xmatch_poolers"):
        xmatch.registry.poolers.get("nothing-like-it")


def test_decorator_registers_a_pooler_class():
    @xmatch.register_pooler("test-dot-first")
    class DotFirst(xmatch.Pooler):
        uses_tokens = False

        def pairwise(self, img, txt, **_):
            return img.tokens[:, 0] @ txt.tokens[:, 0].T

    assert xmatch.registry.poolers.get("TEST-DOT-FIRST") is DotFirst
    assert "test-dot-first" in xmatch.list_components("poolers")


def test_entry_point_plugin_is_discovered(tmp_path, monkeypatch):
    """A real (throwaway) distribution on sys.path declares a pooler and a zoo entry."""
    pkg = tmp_path / "xmatch_testplugin"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(textwrap.dedent("""
        import xmatch
        from xmatch.components.poolers import MrSwPooler

        class PluginPooler(MrSwPooler):
            '''MrSw under another name, from a plugin.'''

        ENTRY = {"description": "plugin entry", "spec": {}}
    """))
    dist = tmp_path / "xmatch_testplugin-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: xmatch-testplugin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(
        "[xmatch_poolers]\nplugin-pooler = xmatch_testplugin:PluginPooler\n\n"
        "[xmatch_models]\nplugin-entry = xmatch_testplugin:ENTRY\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    poolers, models = xmatch.registry.poolers, xmatch.registry.models
    for reg in (poolers, models):
        monkeypatch.setattr(reg, "_names", dict(reg._names))
        monkeypatch.setattr(reg, "_origin", dict(reg._origin))
        reg.refresh_entry_points()
    try:
        assert "plugin-pooler" in xmatch.list_components("poolers")
        assert poolers.origin("plugin-pooler") == "xmatch-testplugin"
        assert poolers.get("Plugin-Pooler").__name__ == "PluginPooler"
        assert "plugin-entry" in xmatch.list_models("plugin-*")
        assert xmatch.info("plugin-entry").description == "plugin entry"
    finally:
        sys.modules.pop("xmatch_testplugin", None)
        for reg in (poolers, models):
            reg.refresh_entry_points()
