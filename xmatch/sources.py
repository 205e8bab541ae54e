"""Resolve where a pretrained asset lives: a local path, a hub id, or a file inside a package."""

from __future__ import annotations

import importlib.util
from pathlib import Path

PACKAGE_PREFIX = "package:"


def resolve_local_source(source: str) -> str:
    """Return a local path for ``package:module/sub/path`` sources; other sources unchanged.

    Example:
        >>> resolve_local_source("bert-base-uncased")
        'bert-base-uncased'
    """
    if not source.startswith(PACKAGE_PREFIX):
        return source
    module, _, sub = source[len(PACKAGE_PREFIX) :].partition("/")
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"source '{source}': the Python package '{module}' is not installed; "
            f"pip install {module.replace('_', '-')}."
        )
    path = Path(next(iter(spec.submodule_search_locations))) / sub
    if not path.exists():
        raise FileNotFoundError(f"source '{source}': {path} does not exist in the installed package.")
    return str(path)
