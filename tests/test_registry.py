"""Registries: duplicates, case-insensitive lookup, close matches, entry-point plugins."""

from __future__ import annotations

import logging
import sys
import textwrap

import pytest

import xmatch
from xmatch.core.registry import Registry, RegistryError, get_registry


def test_every_kind_has_a_registry_and_decorator():
    for kind in ("image_encoders", "text_encoders", "reasoners", "poolers", "losses", "models", "datasets"):
        assert get_registry(kind).entry_point_group == f"xmatch_{kind}"
    # installed plugins (plugins/) add their own poolers: look at xmatch's
    builtin = [n for n in xmatch.list_components("poolers") if xmatch.core.registry.poolers.origin(n) == "xmatch"]
    assert builtin == ["global-cosine", "MrAvgw", "MrSw", "MwSr", "Symm"]
    assert {"bert", "bigru", "bilstm"} <= set(xmatch.list_components("text_encoders"))


def test_lookup_is_case_insensitive():
    assert xmatch.core.registry.poolers.get("mrsw") is xmatch.core.registry.poolers.get("MrSw")
    assert xmatch.core.registry.poolers.canonical("SYMM") == "Symm"


def test_duplicates_raise():
    reg = Registry("test_dupes")
    reg.register("Thing", object())
    with pytest.raises(RegistryError, match="already registered"):
        reg.register("thing", object())
    with pytest.raises(RegistryError, match="already registered"):
        xmatch.register_pooler("mrsw")(type("Other", (xmatch.Pooler,), {}))


def test_unknown_name_lists_close_matches_and_plugin_hint():
    with pytest.raises(RegistryError) as err:
        xmatch.core.registry.poolers.get("MrSW2")
    assert "Did you mean: 'MrSw'" in str(err.value) and "Available:" in str(err.value)
    with pytest.raises(RegistryError, match="pip install xmatch-scan"):
        xmatch.core.registry.poolers.get("scan-nothing")
    with pytest.raises(RegistryError, match="entry-point group xmatch_poolers"):
        xmatch.core.registry.poolers.get("nothing-like-it")


def test_decorator_registers_a_pooler_class():
    @xmatch.register_pooler("test-dot-first")
    class DotFirst(xmatch.Pooler):
        uses_tokens = False

        def pairwise(self, img, txt, **_):
            return img.tokens[:, 0] @ txt.tokens[:, 0].T

    assert xmatch.core.registry.poolers.get("TEST-DOT-FIRST") is DotFirst
    assert "test-dot-first" in xmatch.list_components("poolers")


@pytest.fixture
def isolated():
    """The pooler and model registries, restored after the test (entry points looked up again)."""
    registries = (xmatch.core.registry.poolers, xmatch.core.registry.models)
    with registries[0].restored(), registries[1].restored():
        for reg in registries:
            reg.refresh_entry_points()
        yield registries


def fake_distribution(root, name: str, entry_points: str, modules: dict[str, str]) -> None:
    """A (throwaway) installed distribution under ``root``: its modules and its entry points."""
    for module, code in modules.items():
        (root / f"{module}.py").write_text(textwrap.dedent(code))
    dist = root / f"{name.replace('-', '_')}-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(textwrap.dedent(entry_points))


def test_entry_point_plugin_is_discovered(tmp_path, monkeypatch, isolated):
    """A real (throwaway) distribution on sys.path declares a pooler and a zoo entry."""
    fake_distribution(tmp_path, "xmatch-testplugin", """
        [xmatch_poolers]
        plugin-pooler = xmatch_testplugin:PluginPooler

        [xmatch_models]
        plugin-entry = xmatch_testplugin:ENTRY
    """, {"xmatch_testplugin": '''
        from xmatch.components.poolers import MrSwPooler

        class PluginPooler(MrSwPooler):
            """MrSw under another name, from a plugin."""

        ENTRY = {"description": "plugin entry", "spec": {}}
    '''})
    monkeypatch.syspath_prepend(str(tmp_path))
    poolers, _ = isolated
    try:
        assert "plugin-pooler" in xmatch.list_components("poolers")
        assert poolers.origin("plugin-pooler") == "xmatch-testplugin"
        assert not poolers.is_builtin("plugin-pooler")
        assert poolers.get("Plugin-Pooler").__name__ == "PluginPooler"
        assert "plugin-entry" in xmatch.list_models("plugin-*")
        assert xmatch.info("plugin-entry").description == "plugin entry"
    finally:
        sys.modules.pop("xmatch_testplugin", None)


def test_a_plugin_that_fails_to_import_is_reported_and_hides_no_other(tmp_path, monkeypatch, isolated, caplog):
    fake_distribution(tmp_path, "xmatch-broken", """
        [xmatch_poolers]
        broken-pooler = xmatch_broken_mod:Pooler
    """, {"xmatch_broken_mod": "import a_module_that_is_not_installed\n"})
    fake_distribution(tmp_path, "xmatch-healthy", """
        [xmatch_poolers]
        healthy-pooler = xmatch_healthy_mod:Pooler
    """, {"xmatch_healthy_mod": "from xmatch.components.poolers import MrSwPooler as Pooler\n"})
    monkeypatch.syspath_prepend(str(tmp_path))
    poolers, _ = isolated
    try:
        with caplog.at_level(logging.WARNING, logger="xmatch.core.registry"):
            assert poolers.get("healthy-pooler").__name__ == "MrSwPooler"  # loaded although its neighbour fails
        assert "MrSw" in poolers.names() and "healthy-pooler" in poolers.names()
        assert "broken-pooler" not in poolers.names()
        # reported by name: in the log, by broken(), and by a lookup of the broken name
        assert "'broken-pooler = xmatch_broken_mod:Pooler' of xmatch-broken" in caplog.text
        assert "a_module_that_is_not_installed" in poolers.broken()["broken-pooler"]
        with pytest.raises(RegistryError, match=r"xmatch-broken .*failed to load: ModuleNotFoundError.*Reinstall or fix"):
            poolers.get("Broken-Pooler")
        with pytest.raises(RegistryError, match=r"1 plugin entry point\(s\) of this group failed to load \(broken-pooler\)"):
            poolers.get("no-such-pooler")
    finally:
        for module in ("xmatch_broken_mod", "xmatch_healthy_mod"):
            sys.modules.pop(module, None)


def test_a_plugin_name_that_clashes_with_a_builtin_leaves_the_builtin(tmp_path, monkeypatch, isolated):
    fake_distribution(tmp_path, "xmatch-clash", """
        [xmatch_poolers]
        mrsw = xmatch_clash_mod:Pooler
        clash-free = xmatch_clash_mod:Pooler
    """, {"xmatch_clash_mod": "from xmatch.components.poolers import SymmPooler as Pooler\n"})
    monkeypatch.syspath_prepend(str(tmp_path))
    poolers, _ = isolated
    try:
        assert poolers.get("MrSw").__name__ == "MrSwPooler" and poolers.is_builtin("MrSw")
        assert poolers.origin("clash-free") == "xmatch-clash"
        assert "clashes with the name registered by xmatch, which keeps it" in poolers.broken()["mrsw"]
    finally:
        sys.modules.pop("xmatch_clash_mod", None)


def test_registrations_made_at_run_time_are_not_builtins(isolated):
    poolers, models = isolated

    @xmatch.register_pooler("test-runtime-pooler")
    class RuntimePooler(xmatch.components.poolers.MrSwPooler):
        pass

    assert poolers.origin("test-runtime-pooler") == f"{__name__} (registered at run time)"
    assert not poolers.is_builtin("test-runtime-pooler")
    models.register("test-runtime-entry", xmatch.info("tern-coco"))
    assert models.origin("test-runtime-entry") == "registered at run time"
    assert "test-runtime-entry" not in [n for n in xmatch.list_models() if models.is_builtin(n)]
    assert models.is_builtin("tern-coco") and poolers.origin("MrSw") == "xmatch"


def test_first_lookups_from_several_threads_at_once_all_find_a_lazy_name(tmp_path, monkeypatch):
    """A lazily registered name whose module imports slowly, looked up by four threads at the
    same moment: each gets the object (without the loading lock, the threads after the first
    found the name claimed but not yet registered)."""
    import threading

    (tmp_path / "slow_component_mod.py").write_text("import time\ntime.sleep(0.3)\nclass Slow:\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    reg = Registry("test_threads_lazy")
    reg.register_lazy("slow", "slow_component_mod:Slow", origin="xmatch")
    start = threading.Barrier(4)
    found: list[object] = []
    failures: list[BaseException] = []

    def look_up() -> None:
        start.wait()
        try:
            found.append(reg.get("slow"))
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=look_up) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures, failures
    assert len(found) == 4 and {obj.__name__ for obj in found} == {"Slow"}
