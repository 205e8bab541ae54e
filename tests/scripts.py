"""Loading a repository script (``benchmarks/*.py``, ``tools/*.py``) as a module, for the tests
of what it computes."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType


def load_script(path: Path, name: str | None = None) -> ModuleType:
    """The module of the script at ``path``, executed once under ``name`` (its stem by default);
    not registered in ``sys.modules``."""
    spec = importlib.util.spec_from_file_location(name or path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
