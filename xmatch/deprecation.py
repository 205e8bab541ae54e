"""Old names kept working for a while: a module ``__getattr__`` that serves renamed objects
under their old names, or the names of a module that moved from its old path, with a
DeprecationWarning.

Example:
    In xmatch/components/poolers.py, after the classes were renamed, the old name still
    imports, with a warning:

    >>> __getattr__ = renamed_names("xmatch.components.poolers", {"MrSw": "MrSwPooler"})  # at a module's end  # doctest: +SKIP
    >>> import warnings
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     from xmatch.components.poolers import MrSw
    >>> MrSw.__name__, str(caught[0].message).split(";")[0]
    ('MrSwPooler', 'xmatch.components.poolers.MrSw is now called MrSwPooler')
"""

from __future__ import annotations

import importlib
import sys
import warnings
from collections.abc import Callable, Collection, Mapping
from typing import Any


def renamed_names(module: str, renames: Mapping[str, str]) -> Callable[[str], Any]:
    """A module-level ``__getattr__`` for ``module`` that maps each old name in ``renames`` to
    the object now called by the new name, warning once per use site.

    Args:
        module: the module's ``__name__``.
        renames: old name -> new name (an attribute of the same module).

    Example:
        >>> import types
        >>> demo = types.ModuleType("demo"); demo.NewThing = 1
        >>> sys.modules["demo"] = demo
        >>> demo.__getattr__ = renamed_names("demo", {"OldThing": "NewThing"})
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     value = demo.__getattr__("OldThing")
        >>> value, caught[0].category.__name__
        (1, 'DeprecationWarning')
    """

    def __getattr__(name: str) -> Any:
        if name not in renames:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        new = renames[name]
        warnings.warn(
            f"{module}.{name} is now called {new}; import {new} (the old name will stop working in a future release).",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(sys.modules[module], new)

    return __getattr__


def moved_names(
    module: str,
    new_module: str,
    names: Collection[str] | None = None,
    *,
    fallback: Callable[[str], Any] | None = None,
) -> Callable[[str], Any]:
    """A module-level ``__getattr__`` for ``module``, whose contents moved to ``new_module``:
    each name (every public and private one, or only ``names``) is served from the new module,
    with a warning that names the new path.

    Args:
        module: the old module's ``__name__``.
        new_module: where the names live now.
        names: the names that moved (None: all of them); others are an ``AttributeError``, so
            that a package's submodules still import.
        fallback: the ``__getattr__`` asked for the other names instead (names that moved to
            another module, or :func:`renamed_names`).

    Example:
        In xmatch/data/scenes.py, left behind when the module moved to xmatch/scenes/dataset.py:

        >>> __getattr__ = moved_names("xmatch.data.scenes", "xmatch.scenes.dataset")  # at the old module's end  # doctest: +SKIP
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     from xmatch.data.scenes import open_scenes
        >>> open_scenes.__module__, str(caught[0].message).split(";")[0]
        ('xmatch.scenes.dataset', 'xmatch.data.scenes moved to xmatch.scenes.dataset')
    """

    def __getattr__(name: str) -> Any:
        if name.startswith("__") or (names is not None and name not in names):
            if fallback is not None:
                return fallback(name)
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        try:
            value = getattr(importlib.import_module(new_module), name)
        except AttributeError:
            raise AttributeError(f"module {module!r} has no attribute {name!r}") from None
        warnings.warn(
            f"{module} moved to {new_module}; import {name} from {new_module} "
            "(the old path will stop working in a future release).",
            DeprecationWarning,
            stacklevel=2,
        )
        return value

    return __getattr__
