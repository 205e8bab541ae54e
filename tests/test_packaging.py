"""The wheel must ship every subpackage: pyproject lists them by hand (zoo/ is mapped in)."""

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_subpackage_is_listed_in_pyproject():
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {
        ".".join(init.parent.relative_to(ROOT).parts)
        for init in (ROOT / "xmatch").rglob("__init__.py")
    }
    assert found - listed == set(), f"add {sorted(found - listed)} to [tool.setuptools] packages"
