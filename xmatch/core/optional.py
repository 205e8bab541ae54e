"""Optional packages: imported where a feature needs them, with an error that says what to install.

The import name of a package is often not the name pip knows it by (``sklearn`` is
``scikit-learn``, ``rouge_score`` is ``rouge-score``), so a bare ``ModuleNotFoundError`` does
not tell the user what to do; :func:`require` does.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from xmatch.core.errors import XmatchError


class MissingDependencyError(XmatchError, ImportError):
    """An optional package a feature needs is not installed (the message gives the pip command)."""


def require(module: str, pip_name: str, feature: str) -> ModuleType:
    """Import ``module`` for ``feature``, or raise an error naming the pip command.

    Args:
        module: the import name, e.g. ``"sklearn.datasets"``.
        pip_name: what to install: a distribution (``"scikit-learn"``) or an extra
            (``"xmatch-zoo[index]"``).
        feature: what needs it, for the message (``"rendering the scenes' digits"``).

    Raises:
        MissingDependencyError: the package (or a package it needs) is not installed.

    Example:
        >>> require("json", "json", "this example").__name__
        'json'
        >>> require("no_such_package.datasets", "no-such-package", "the scenes' digit glyphs")
        Traceback (most recent call last):
        xmatch.core.optional.MissingDependencyError: the scenes' digit glyphs needs the optional package no_such_package,
        which is not installed (No module named 'no_such_package'): pip install "no-such-package"
    """
    top = module.partition(".")[0]
    try:
        importlib.import_module(top)  # first: a cached submodule would hide a missing package
        return importlib.import_module(module)
    except ImportError as exc:
        if (exc.name or top).partition(".")[0] == top:
            state = f"which is not installed ({exc})"
        else:  # the package is there but something it imports is not
            state = f"which is installed but cannot be imported ({exc}); reinstall it"
        raise MissingDependencyError(
            f'{feature} needs the optional package {top}, {state}: pip install "{pip_name}"'
        ) from None
