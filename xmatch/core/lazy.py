"""Public names of a package imported on first use (PEP 562), so that importing the package,
and parsing the command line, does not import torch and the model stack."""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable, Mapping
from typing import Any


def lazy_names(package: str, names: Mapping[str, str], subpackages: bool = False) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """A package's ``__getattr__`` and ``__dir__``: ``names`` maps a public name to the module
    that defines it, imported when the name is first read and then kept in the package;
    with ``subpackages``, any other name that is a module of the package is imported too
    (``xmatch.index`` after a bare ``import xmatch``).

    Example:
        >>> getattr_, dir_ = lazy_names("xmatch.regions", {"RoIConfig": "xmatch.regions.config"})
        >>> getattr_("RoIConfig").__name__
        'RoIConfig'
    """
    namespace = importlib.import_module(package).__dict__

    def __getattr__(name: str) -> Any:
        if name in names:
            value = getattr(importlib.import_module(names[name]), name)
        elif subpackages and not name.startswith("_") and importlib.util.find_spec(f"{package}.{name}") is not None:
            value = importlib.import_module(f"{package}.{name}")
        else:
            raise AttributeError(f"module '{package}' has no attribute {name!r}")
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *names})

    return __getattr__, __dir__
