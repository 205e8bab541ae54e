"""OAN zoo entries: data in ``zoo.toml``, one entry point per entry (``xmatch_models``).

Each entry point names a callable returning the entry as a dict with a ``spec``
(``xmatch._zoo.as_entry`` accepts that). An entry may name a ``base`` entry and
``overrides`` of its spec; the paper's figures, weights and parameter count are never
inherited (they belong to one architecture).

Example:
    >>> oan_f30k()["spec"]["text_encoder"]["max_length"]
    80
"""

from __future__ import annotations

import copy
import functools
import importlib.resources
import tomllib
from collections.abc import Callable
from typing import Any

from xmatch.spec import merge

NOT_INHERITED = ("metrics", "weights", "params")


@functools.cache
def _raw() -> dict[str, dict[str, Any]]:
    text = importlib.resources.files(__package__).joinpath("zoo.toml").read_text(encoding="utf-8")
    return tomllib.loads(text)


def resolve(name: str, seen: tuple[str, ...] = ()) -> dict[str, Any]:
    """The entry ``name`` of ``zoo.toml`` with its base applied."""
    raw = _raw()
    if name not in raw:
        raise KeyError(f"no OAN zoo entry '{name}'; entries: {', '.join(sorted(raw))}.")
    if name in seen:
        raise ValueError(f"zoo entries {' -> '.join((*seen, name))} form a cycle of bases.")
    table = copy.deepcopy(raw[name])
    base_name = table.pop("base", None)
    if base_name is None:
        return table
    base = resolve(base_name, (*seen, name))
    for key in NOT_INHERITED:
        base.pop(key, None)
    spec = merge(base.pop("spec"), table.pop("overrides", {}))
    return {**base, **table, "spec": spec}


def _entry(name: str) -> Callable[[], dict[str, Any]]:
    def entry() -> dict[str, Any]:
        return resolve(name)

    entry.__name__ = name.replace("-", "_")
    entry.__doc__ = f"The zoo entry '{name}'."
    return entry


oan_coco = _entry("oan-coco")
oan_f30k = _entry("oan-f30k")
