"""SCAN zoo entries (Lee et al., "Stacked Cross Attention for Image-Text Matching", ECCV 2018).

The entries are data (``xmatch_scan/zoo.toml``, shipped inside the package) in the layout of
xmatch's own zoo, read by :func:`xmatch.zoo_entries_from_toml` (xmatch's loader and schema);
each one is declared as an entry point of the group ``xmatch_models`` naming one of the
:class:`xmatch.ZooEntry` objects below. The paper's ensembles are in ``ensembles.toml``.

Example:
    >>> import xmatch
    >>> xmatch.list_models("scan-t2i-*")
    ['scan-t2i-avg-coco', 'scan-t2i-avg-f30k', 'scan-t2i-lse-coco', 'scan-t2i-lse-f30k']
"""

from __future__ import annotations

import copy
import importlib.resources
import tomllib
from dataclasses import dataclass, field
from typing import Any

from xmatch import ZooEntry, zoo_entries_from_toml

ZOO_FILE = "zoo.toml"
ENSEMBLES_FILE = "ensembles.toml"
ENTRIES: dict[str, ZooEntry] = zoo_entries_from_toml(__package__, ZOO_FILE)


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


def entry(name: str) -> ZooEntry:
    """The zoo entry ``name`` of this plugin (a copy: editing it changes no other).

    Example:
        >>> entry("scan-i2t-lse-coco").spec["pooler"]["lambda_lse"]
        20.0
    """
    if name not in ENTRIES:
        raise KeyError(f"xmatch-scan has no zoo entry '{name}'; its entries: {', '.join(entry_names())}.")
    return copy.deepcopy(ENTRIES[name])


def entry_names() -> list[str]:
    """Names of every entry in the plugin's zoo file."""
    return sorted(ENTRIES)


def paper_ensembles() -> dict[str, PaperEnsemble]:
    """The paper's t-i + i-t ensembles, by name (``scan-ensemble-f30k``, ``scan-ensemble-coco``).

    Example:
        >>> paper_ensembles()["scan-ensemble-coco"].metrics["coco-1k"]["i2t_r1"]
        72.7
    """
    text = importlib.resources.files(__package__).joinpath(ENSEMBLES_FILE).read_text(encoding="utf-8")
    tables = tomllib.loads(text)
    return {
        name: PaperEnsemble(name, table["dataset"], tuple(table["members"]), table.get("metrics", {}))
        for name, table in tables.items()
    }


# One name per entry point of the group xmatch_models (see pyproject.toml).
scan_t2i_lse_f30k = ENTRIES["scan-t2i-lse-f30k"]
scan_t2i_avg_f30k = ENTRIES["scan-t2i-avg-f30k"]
scan_i2t_lse_f30k = ENTRIES["scan-i2t-lse-f30k"]
scan_i2t_avg_f30k = ENTRIES["scan-i2t-avg-f30k"]
scan_t2i_lse_coco = ENTRIES["scan-t2i-lse-coco"]
scan_t2i_avg_coco = ENTRIES["scan-t2i-avg-coco"]
scan_i2t_lse_coco = ENTRIES["scan-i2t-lse-coco"]
scan_i2t_avg_coco = ENTRIES["scan-i2t-avg-coco"]
