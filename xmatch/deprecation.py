"""Old names kept working for a while: a module ``__getattr__`` that serves renamed objects
under their old names with a DeprecationWarning.

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

import sys
import warnings
from collections.abc import Callable, Mapping
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
