"""Plugins, the tutorial and the tests use xmatch's public surface only.

A name that starts with ``_`` (a private module such as ``xmatch.data._io``, or a private name of a
public module such as ``xmatch.io.hub._sha256``) may change in any release, so nothing outside
the library may reach it. Everything a plugin needs is in :mod:`xmatch.plugin`. The checker
reads the code (AST), so a private import fails here before a plugin breaks on a user's machine.

- The plugins in ``plugins/`` (their tests included) and the plugin that
  ``docs/tutorial-plugin.md`` writes may not use any private name, in any way.
- xmatch's own tests (``tests/``) may not import a private name nor reach into a private
  module; swapping a private value of a public module in a test of that module
  (``monkeypatch.setattr(hub, "_DIGESTS", {})``) is how its internals are tested, and allowed.
  ``INTERNAL_TESTS`` lists the few tests that import xmatch's private helpers to test them
  directly, each with the exact names and why; any other private import fails.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

import xmatch.plugin

ROOT = Path(__file__).resolve().parents[1]
TUTORIAL = ROOT / "docs" / "tutorial-plugin.md"
PYTHON_BLOCK = re.compile(r"^```python[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)
PRIVATE_PATH = re.compile(r"^xmatch(\.\w+)*\._\w+")

#: tests of xmatch's own private helpers: file -> {private dotted name: why it is tested directly}
INTERNAL_TESTS: dict[str, dict[str, str]] = {
    "tests/test_zoo.py": {
        "xmatch.core.zoo._resolve": "what an entry inherits from its base is checked on raw tables",
    },
}


@dataclass(frozen=True)
class PrivateUse:
    """One use of a private xmatch name: where, the dotted name reached, and whether it is an
    import or a path through a private module (else the private attribute of a public module)."""

    where: str
    line: int
    name: str
    imported: bool

    def __str__(self) -> str:
        return f"{self.where}:{self.line}: {self.name}"


def _private(dotted: str) -> bool:
    return any(part.startswith("_") and not part.startswith("__") for part in dotted.split(".")[1:])


def _is_module(dotted: str) -> bool:
    """Whether ``dotted`` (an xmatch name) is a module, so that its ``_`` attributes are private names."""
    try:
        importlib.import_module(dotted)
    except ImportError:
        return False
    return True


def private_uses(source: str, where: str) -> list[PrivateUse]:
    """Every private xmatch name that ``source`` imports or reaches.

    Found: ``import xmatch._mod``, ``from xmatch._mod import ...``, ``from xmatch.mod import
    _name``, ``xmatch._attr`` / ``module._attr`` on an imported xmatch module,
    ``setattr(module, "_name", ...)`` (``monkeypatch.setattr`` too) and dotted strings such
    as ``"xmatch.io.hub._sha256"``. Dunder names (``__version__``) are public.

    Example:
        >>> [u.name for u in private_uses("from xmatch.data._io import load_json", "x.py")]
        ['xmatch.data._io']
    """
    tree = ast.parse(source, filename=where)
    modules: dict[str, str] = {}  # local name -> dotted xmatch name it stands for
    found: list[PrivateUse] = []

    def report(node: ast.AST, dotted: str, imported: bool = False) -> None:
        through_private_module = _private(dotted.rpartition(".")[0]) or (not imported and _is_module(dotted))
        found.append(PrivateUse(where, getattr(node, "lineno", 0), dotted, imported or through_private_module))

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "xmatch" or alias.name.startswith("xmatch."):
                    if _private(alias.name):
                        report(node, alias.name, imported=True)
                    local = alias.asname or alias.name.split(".")[0]
                    modules[local] = alias.name if alias.asname else "xmatch"
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module != "xmatch" and not node.module.startswith("xmatch."):
                continue
            if _private(node.module):
                report(node, node.module, imported=True)
            for alias in node.names:
                dotted = f"{node.module}.{alias.name}"
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    report(node, dotted, imported=True)
                modules[alias.asname or alias.name] = dotted
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            base = _dotted(node.value, modules)
            if base is not None and _is_module(base):
                report(node, f"{base}.{node.attr}")
        elif isinstance(node, ast.Call) and _called_name(node.func) in ("setattr", "getattr", "delattr"):
            if len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str):
                base = _dotted(node.args[0], modules)
                attr = node.args[1].value
                if base is not None and attr.startswith("_") and not attr.startswith("__") and _is_module(base):
                    report(node, f"{base}.{attr}")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and PRIVATE_PATH.match(node.value):
            report(node, PRIVATE_PATH.match(node.value).group(0))
    return sorted(set(found), key=lambda u: (u.line, u.name))


def _dotted(node: ast.AST, modules: dict[str, str]) -> str | None:
    """The dotted xmatch name an expression like ``xmatch.eval.spice`` stands for, else None."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name) or node.id not in modules:
        return None
    return ".".join([modules[node.id], *reversed(parts)])


def _called_name(func: ast.AST) -> str | None:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return None


def checked_sources() -> list[tuple[str, str]]:
    """``(where, code)``: every .py file under plugins/ and tests/ (not the recorded fixtures'
    generators, which run the original research code), and each python block of the tutorial."""
    sources = []
    for folder in ("plugins", "tests"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            relative = path.relative_to(ROOT).as_posix()
            if relative.startswith("tests/fixtures/") or relative == "tests/test_public_surface.py":
                continue  # the fixtures' generators run the original research code; this file holds examples
            sources.append((relative, path.read_text(encoding="utf-8")))
    text = TUTORIAL.read_text(encoding="utf-8")
    for match in PYTHON_BLOCK.finditer(text):
        line = text.count("\n", 0, match.start()) + 1
        sources.append((f"docs/tutorial-plugin.md (block at line {line})", match.group(1)))
    return sources


def forbidden(use: PrivateUse) -> bool:
    """Plugins and the tutorial: every private use; xmatch's own tests: imports and private modules."""
    return use.imported or not use.where.startswith("tests/")


def test_plugins_tutorial_and_tests_use_only_public_names():
    allowed = {(where, name) for where, names in INTERNAL_TESTS.items() for name in names}
    uses = [u for where, code in checked_sources() for u in private_uses(code, where) if forbidden(u)]
    bad = [str(u) for u in uses if (u.where, u.name) not in allowed]
    assert not bad, (
        "private xmatch names used outside the library (use xmatch.plugin or another public module; "
        "a test of xmatch's own internals goes into INTERNAL_TESTS with its reason):\n" + "\n".join(bad)
    )
    used = {(u.where, u.name) for u in uses}
    stale = sorted(allowed - used)
    assert not stale, f"INTERNAL_TESTS lists private names no test uses any more; remove them: {stale}"


def test_the_plugins_import_xmatch_only_through_public_modules():
    # Stricter for plugin packages: no exceptions at all, and the checker really sees their files.
    plugin_sources = [(w, c) for w, c in checked_sources() if w.startswith("plugins/") and "/tests/" not in w]
    assert len(plugin_sources) >= 15
    assert [str(u) for w, c in plugin_sources for u in private_uses(c, w)] == []


@pytest.mark.parametrize("code, names", [
    ("import xmatch.core.zoo", []),  # a library module: public
    ("import xmatch.data._io as io", ["xmatch.data._io"]),
    ("from xmatch.data._io import load_json", ["xmatch.data._io"]),
    ("from xmatch.cli.main import _nested", ["xmatch.cli.main._nested"]),
    ("import xmatch\nxmatch.data._io.load_json('a', 'b')", ["xmatch.data._io"]),
    ("from xmatch.io import hub\nhub._sha256", ["xmatch.io.hub._sha256"]),
    ("from xmatch.eval import spice\ndef t(m):\n    m.setattr(spice, '_java_major', 8)", ["xmatch.eval.spice._java_major"]),
    ("def t(m):\n    m.setattr('xmatch.io.hub._DIGESTS', {})", ["xmatch.io.hub._DIGESTS"]),
    ("import xmatch\nxmatch.__version__", []),
    ("from xmatch.core.registry import poolers\npoolers._names", []),  # an object's attribute, not a module's
    ("from xmatch.plugin import Pooler, lengths_to_mask", []),
    ("import os._x", []),
])
def test_the_checker_finds_every_kind_of_private_use(code, names):
    assert [u.name for u in private_uses(code, "x.py")] == names


def test_xmatch_tests_may_swap_private_values_of_public_modules_but_not_import_them():
    swap = private_uses("from xmatch.io import hub\ndef t(m):\n    m.setattr(hub, '_DIGESTS', {})", "tests/test_x.py")
    assert [forbidden(u) for u in swap] == [False]
    assert [forbidden(u) for u in private_uses("from xmatch.io.hub import _DIGESTS", "tests/test_x.py")] == [True]
    assert [forbidden(u) for u in private_uses("import xmatch\nxmatch.data._io.load_json", "tests/test_x.py")] == [True]
    assert [forbidden(u) for u in private_uses("from xmatch.io import hub\nhub._x", "plugins/p/a.py")] == [True]


def test_every_name_of_xmatch_plugin_exists_and_is_documented():
    doc = inspect.getdoc(xmatch.plugin)
    for name in xmatch.plugin.__all__:
        assert hasattr(xmatch.plugin, name), name
        assert not name.startswith("_"), name
        assert f"`{name}`" in doc, f"xmatch.plugin's docstring does not say what {name} is for"
