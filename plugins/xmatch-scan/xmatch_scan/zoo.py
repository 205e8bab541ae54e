"""SCAN zoo entries (Lee et al., "Stacked Cross Attention for Image-Text Matching", ECCV 2018).

The entries are data (``xmatch_scan/scan.toml``, shipped inside the package); each one is
declared as an entry point of the group ``xmatch_models`` pointing at one of the small
callables below, which xmatch calls to get the :class:`xmatch.ZooEntry`.

Example:
    >>> import xmatch
    >>> xmatch.list_models("scan-t2i-*")
    ['scan-t2i-avg-coco', 'scan-t2i-avg-f30k', 'scan-t2i-lse-coco', 'scan-t2i-lse-f30k']
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import importlib.resources
import tomllib
from dataclasses import dataclass, field
from typing import Any

from xmatch.plugin import ZooEntry, merge

DATA_FILE = "scan.toml"
ENTRY_FIELDS = frozenset(f.name for f in dataclasses.fields(ZooEntry)) - {"name"}
#: fields an entry takes from its base (figures and the dataset-specific recipe are its own)
INHERITED = ("spec", "paper", "licence", "origin", "params", "input")


@dataclass(frozen=True)
class PaperEnsemble:
    """One of the paper's "SCAN t-i + i-t" ensembles: two zoo models whose similarity
    matrices are averaged, and the paper's figures for it.

    Evaluate it with ``xmatch.eval.evaluate([xmatch.build(m, ...) for m in e.members], dataset, protocol)``.
    """

    name: str
    dataset: str
    members: tuple[str, ...]
    metrics: dict[str, dict[str, Any]] = field(default_factory=dict)


@functools.cache
def _raw() -> dict[str, Any]:
    text = importlib.resources.files("xmatch_scan").joinpath(DATA_FILE).read_text(encoding="utf-8")
    data = tomllib.loads(text)
    unknown = set(data) - {"entries", "ensembles"}
    if unknown:
        raise ValueError(f"{DATA_FILE}: unknown top-level tables {sorted(unknown)}; expected entries, ensembles.")
    return data


def _resolve(name: str, tables: dict[str, dict[str, Any]], seen: tuple[str, ...] = ()) -> dict[str, Any]:
    if name not in tables:
        raise ValueError(f"{DATA_FILE}: no entry '{name}' (named as a base by {seen[-1] if seen else '?'}).")
    if name in seen:
        raise ValueError(f"{DATA_FILE}: entries {' -> '.join((*seen, name))} form a cycle of bases.")
    table = copy.deepcopy(tables[name])
    base_name = table.pop("base", None)
    overrides = table.pop("overrides", {})
    unknown = set(table) - ENTRY_FIELDS
    if unknown:
        raise ValueError(f"{DATA_FILE}: entry '{name}' has unknown keys {sorted(unknown)}; ZooEntry fields: {sorted(ENTRY_FIELDS)}.")
    if base_name is None:
        if overrides:
            raise ValueError(f"{DATA_FILE}: entry '{name}' has overrides but no base to apply them to.")
        return table
    base = _resolve(base_name, tables, (*seen, name))
    inherited = {k: base[k] for k in INHERITED if k in base}
    inherited["spec"] = merge(base["spec"], overrides)
    return {**inherited, **table}


def entry(name: str) -> ZooEntry:
    """The zoo entry ``name`` of this plugin.

    Example:
        >>> entry("scan-i2t-lse-coco").spec["pooler"]["lambda_lse"]
        20.0
    """
    return ZooEntry(name=name, **_resolve(name, _raw()["entries"]))


def entry_names() -> list[str]:
    """Names of every entry in the plugin's data file."""
    return sorted(_raw()["entries"])


def paper_ensembles() -> dict[str, PaperEnsemble]:
    """The paper's t-i + i-t ensembles, by name (``scan-ensemble-f30k``, ``scan-ensemble-coco``).

    Example:
        >>> paper_ensembles()["scan-ensemble-coco"].metrics["coco-1k"]["i2t_r1"]
        72.7
    """
    out = {}
    for name, table in _raw()["ensembles"].items():
        table = copy.deepcopy(table)
        out[name] = PaperEnsemble(name, table["dataset"], tuple(table["members"]), table.get("metrics", {}))
    return out


# One callable per entry point of the group xmatch_models (see pyproject.toml).


def scan_t2i_lse_f30k() -> ZooEntry:
    return entry("scan-t2i-lse-f30k")


def scan_t2i_avg_f30k() -> ZooEntry:
    return entry("scan-t2i-avg-f30k")


def scan_i2t_lse_f30k() -> ZooEntry:
    return entry("scan-i2t-lse-f30k")


def scan_i2t_avg_f30k() -> ZooEntry:
    return entry("scan-i2t-avg-f30k")


def scan_t2i_lse_coco() -> ZooEntry:
    return entry("scan-t2i-lse-coco")


def scan_t2i_avg_coco() -> ZooEntry:
    return entry("scan-t2i-avg-coco")


def scan_i2t_lse_coco() -> ZooEntry:
    return entry("scan-i2t-lse-coco")


def scan_i2t_avg_coco() -> ZooEntry:
    return entry("scan-i2t-avg-coco")
