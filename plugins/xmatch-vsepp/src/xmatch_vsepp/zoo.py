"""VSE++ zoo entries: data in ``zoo.toml``, one entry point per entry (``xmatch_models``).

Each entry point names a callable returning the entry as a dict with a ``spec``
(``xmatch._zoo.as_entry`` accepts that). An entry may name a ``base`` entry and
``overrides`` of its spec; the paper's figures, weights and parameter count are never
inherited (they belong to one architecture).

Example:
    >>> vsepp_precomp_coco()["spec"]["pooler"]["name"]
    'global-cosine'
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
        raise KeyError(f"no VSE++ zoo entry '{name}'; entries: {', '.join(sorted(raw))}.")
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


vsepp_precomp_coco = _entry("vsepp-precomp-coco")
vsepp_precomp_f30k = _entry("vsepp-precomp-f30k")
vsepp_vse0_precomp_coco = _entry("vsepp-vse0-precomp-coco")
vsepp_vse0_precomp_f30k = _entry("vsepp-vse0-precomp-f30k")
vsepp_order0_precomp_coco = _entry("vsepp-order0-precomp-coco")
vsepp_order0_precomp_f30k = _entry("vsepp-order0-precomp-f30k")
vsepp_orderpp_precomp_coco = _entry("vsepp-orderpp-precomp-coco")
vsepp_orderpp_precomp_f30k = _entry("vsepp-orderpp-precomp-f30k")
vsepp_vgg19_coco = _entry("vsepp-vgg19-coco")
vsepp_vgg19_f30k = _entry("vsepp-vgg19-f30k")
vsepp_resnet152_coco = _entry("vsepp-resnet152-coco")
vsepp_resnet152_f30k = _entry("vsepp-resnet152-f30k")
