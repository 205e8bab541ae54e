"""Library-wide conventions: every error xmatch (or a plugin) defines is an ``XmatchError`` and
still the built-in it was; library code logs instead of printing; zoo entries spell
``license`` as packaging metadata does (``licence`` is an unknown key)."""

from __future__ import annotations

import ast
import importlib
import inspect
import logging
import pkgutil
import textwrap
from pathlib import Path

import pytest

import xmatch
import xmatch.cli
from xmatch import ZooEntry, zoo_entries_from_toml
from xmatch.core.zoo import as_entry

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("xmatch", "xmatch_scan", "xmatch_vsepp", "xmatch_oan")
#: where printing is the job: the command line, one module per command (elsewhere only a developer
#: tool run as ``python -m`` prints, in its ``main``; the demo hands its report to a callback)
PRINTING_MODULES = {"xmatch.cli", *(f"xmatch.cli.{m.name}" for m in pkgutil.iter_modules(xmatch.cli.__path__))}


def library_modules() -> list[str]:
    names = []
    for package in PACKAGES:
        root = importlib.import_module(package)
        names.append(package)
        names += [m.name for m in pkgutil.walk_packages(root.__path__, f"{package}.") if not m.name.endswith("__main__")]
    return names


def test_every_error_class_is_an_xmatch_error_and_keeps_its_builtin_base():
    """Walks every module of xmatch and of the plugins (a module that does not import fails)."""
    errors = {}
    for name in library_modules():
        module = importlib.import_module(name)
        for attribute, obj in vars(module).items():
            if (inspect.isclass(obj) and issubclass(obj, Exception) and not issubclass(obj, Warning)
                    and obj.__module__ == name and not attribute.startswith("_")):
                errors[f"{name}.{attribute}"] = obj
    assert len(errors) >= 30, sorted(errors)  # the walk found the modules' errors
    assert [n for n, cls in errors.items() if not issubclass(cls, xmatch.XmatchError)] == []
    # existing `except ValueError` / `pytest.raises(OSError)` clauses keep catching them
    builtin = {n: cls for n, cls in errors.items() if cls is not xmatch.XmatchError}
    assert [n for n, cls in builtin.items() if not any(
        base.__module__ == "builtins" and base is not Exception for base in cls.__mro__[1:])] == []
    assert issubclass(errors["xmatch.core.spec.SpecError"], ValueError)
    assert issubclass(errors["xmatch.core.registry.RegistryError"], KeyError)
    assert issubclass(errors["xmatch.io.hub.OfflineError"], FileNotFoundError)
    assert issubclass(errors["xmatch.train.errors.TrainingError"], RuntimeError)


def test_xmatch_error_is_exported():
    assert "XmatchError" in xmatch.__all__ and xmatch.XmatchError.__module__ == "xmatch.core.errors"


def _print_calls(path: Path) -> list[tuple[int, str]]:
    """(line, enclosing function) of each ``print(...)`` call outside a function named ``main``
    and outside ``if __name__ == "__main__":``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = []

    def visit(node: ast.AST, function: str) -> None:
        for child in ast.iter_child_nodes(node):
            inner = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else function
            if isinstance(child, ast.If) and "__main__" in ast.unparse(child.test):
                inner = "main"
            if isinstance(child, ast.Call) and isinstance(child.func, ast.Name) and child.func.id == "print":
                if function != "main":
                    found.append((child.lineno, function))
            visit(child, inner)

    visit(tree, "<module>")
    return found


def test_library_code_logs_and_never_prints():
    offenders = []
    for name in library_modules():
        if name in PRINTING_MODULES:
            continue
        path = Path(importlib.import_module(name).__file__)
        offenders += [f"{name}:{line} (in {function})" for line, function in _print_calls(path)]
    assert offenders == [], "use logging.getLogger(__name__), not print, in library code"


def test_a_training_run_called_from_python_logs_instead_of_printing(fixture_bert, tmp_path, capsys, caplog):
    from learnable import FEATURE_DIM, write_learnable

    from conftest import tiny_spec
    from xmatch.data import open_dataset
    from xmatch.train import TrainConfig, Trainer

    root = write_learnable(tmp_path / "data")
    spec = tiny_spec(fixture_bert)
    spec["image_encoder"]["feature_dim"] = FEATURE_DIM
    model = xmatch.build(spec)
    train = open_dataset("scan-precomp", root, split="train", boxes_normalized=True, max_images=8)
    val = open_dataset("scan-precomp", root, split="dev", boxes_normalized=True)
    config = TrainConfig(epochs=3, batch_size=20, lr=1e-12, early_stopping=1, tensorboard=False)
    with caplog.at_level(logging.INFO, logger="xmatch"):
        Trainer(model, train, config, val_data=val, run_dir=tmp_path / "run", resume=True, progress=False).fit()
    assert capsys.readouterr().out == ""
    assert "no checkpoint in" in caplog.text and "early stopping" in caplog.text
    assert "validation at step 2: rsum" in caplog.text


# -- license -------------------------------------------------------------------------------------


def test_zoo_entries_spell_license_as_packaging_metadata():
    for path in [*REPO.glob("zoo/*.toml"), *REPO.glob("plugins/*/**/*.toml")]:
        assert "\nlicence" not in path.read_text(encoding="utf-8"), path
    entry = xmatch.info("teran-mrsw-scenes")
    assert entry.license.startswith("Apache-2.0") and "license: Apache-2.0" in entry.card()


def test_the_licence_spelling_is_refused(tmp_path, monkeypatch):
    (tmp_path / "old_plugin").mkdir()
    (tmp_path / "old_plugin" / "__init__.py").write_text("")
    (tmp_path / "old_plugin" / "zoo.toml").write_text(textwrap.dedent("""
        [old-entry]
        licence = "MIT"
        spec = {}
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ValueError, match=r"zoo entry 'old-entry' \(old_plugin/zoo.toml\) has unknown keys \['licence'\]"):
        zoo_entries_from_toml("old_plugin")
    with pytest.raises(TypeError, match="'licence'"):
        as_entry("from-a-dict", {"spec": {}, "licence": "MIT"})
    assert not hasattr(ZooEntry(name="x", spec={}, license="MIT"), "licence")
