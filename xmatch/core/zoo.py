"""Zoo entries: named, documented model specs shipped as TOML data in the zoo folder
(:func:`~xmatch.core.sources.zoo_folder`)."""

from __future__ import annotations

import copy
import dataclasses
import fnmatch
import importlib.resources
import tomllib
from dataclasses import dataclass, field
from typing import Any

from xmatch.core.errors import XmatchError
from xmatch.core.registry import RegistryError, get_registry, models
from xmatch.core.sources import HF_HUB, PLUGINS_FILE, unpinned_problem, validate_weight_source, zoo_folder
from xmatch.core.spec import merge

ENTRY_KEYS = {
    "base", "overrides", "spec", "description", "paper", "dataset", "params", "metrics",
    "weights", "license", "origin", "input", "notes",
}
#: the text fields of an entry
_TEXT_FIELDS = ("description", "paper", "dataset", "license", "origin", "notes")


class ZooError(XmatchError, ValueError):
    """A zoo TOML file that cannot be read into entries (the message names the file and the entry)."""


@dataclass
class ZooEntry:
    """A zoo entry: architecture spec, provenance, the paper's metrics and weight sources.

    ``metrics`` maps a benchmark (``coco-1k``, ``coco-5k``, ``f30k-1k``) to its figures and
    the ``source`` (paper and table) they come from. ``params`` is the number of parameters
    of ``xmatch.build(entry)`` (None: not stated); a test recomputes it
    (:func:`xmatch.model.parameter_counts.count_parameters`). For a text encoder whose vocabulary comes from a
    caption corpus it leaves the word-embedding table out (see
    :func:`params_leave_out_vocabulary`).
    """

    name: str
    spec: dict[str, Any]
    description: str = ""
    paper: str = ""
    dataset: str = ""
    params: int | None = None
    metrics: dict[str, dict[str, Any]] = field(default_factory=dict)
    weights: list[dict[str, Any]] = field(default_factory=list)
    license: str = ""
    origin: str = ""
    input: dict[str, Any] = field(default_factory=dict)
    notes: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.spec, dict):
            raise ValueError(f"zoo entry '{self.name}': spec must be a table, got {self.spec!r:.60}.")
        wrong = [f for f in _TEXT_FIELDS if not isinstance(getattr(self, f), str)]
        if wrong:
            raise ValueError(f"zoo entry '{self.name}': {wrong[0]} must be a string, got {getattr(self, wrong[0])!r:.60}.")
        if not isinstance(self.input, dict) or not isinstance(self.metrics, dict) or not all(
                isinstance(v, dict) for v in self.metrics.values()):
            raise ValueError(f"zoo entry '{self.name}': input must be a table and metrics a table of tables.")
        if not isinstance(self.weights, list) or not all(isinstance(w, dict) for w in self.weights):
            raise ValueError(f"zoo entry '{self.name}': weights must be a list of tables, got {self.weights!r:.60}.")
        if self.params is not None and (type(self.params) is not int or self.params <= 0):
            raise ValueError(f"zoo entry '{self.name}': params must be a positive int, got {self.params!r}.")
        for source in self.weights:
            try:
                validate_weight_source(source)
            except (TypeError, ValueError) as exc:
                raise ValueError(f"zoo entry '{self.name}': {exc}") from None
        # a zoo entry is a published promise: every hub reference names an immutable commit
        for where, reference in _hub_references(self):
            try:
                problem = unpinned_problem(reference)
            except ValueError as exc:  # malformed: parse_hf_source says how
                problem = str(exc)
            if problem is not None:
                raise ValueError(f"zoo entry '{self.name}': {where} '{reference}' {problem}.")

    def card(self) -> str:
        """A readable summary of the entry."""
        lines = [f"{self.name}: {self.description}", f"  paper:   {self.paper}", f"  dataset: {self.dataset}"]
        if self.params is not None:
            lines.append(f"  params:  {format_params(self.params, self.spec)}")
        if self.input:
            lines.append("  input:   " + ", ".join(f"{k}={v}" for k, v in self.input.items()))
        for bench, figures in self.metrics.items():
            values = ", ".join(f"{k} {v}" for k, v in figures.items() if k != "source")
            lines.append(f"  {bench}: {values}  [{figures.get('source', '')}]")
        if self.weights:
            for w in self.weights:
                lines.append(f"  weights: {w.get('source')} sha256={w.get('sha256', '?')}")
        else:
            lines.append("  weights: none published in xmatch format")
        if self.origin:
            lines.append(f"  origin:  {self.origin}")
        if self.license:
            lines.append(f"  license: {self.license}")
        if self.notes:
            lines.append(f"  notes:   {self.notes}")
        return "\n".join(lines)

    __str__ = card


def _hub_references(entry: ZooEntry) -> list[tuple[str, str]]:
    """``(where, source)`` of every ``hf-hub:`` reference of ``entry``: its weight sources and
    any string of its spec (a text encoder's ``tokenizer``), ``where`` naming the field."""
    found = [("weights -> source", w["source"]) for w in entry.weights
             if isinstance(w.get("source"), str) and w["source"].startswith(HF_HUB)]

    def walk(value: Any, path: tuple[str, ...]) -> None:
        if isinstance(value, dict):
            for key, item in value.items():
                walk(item, (*path, str(key)))
        elif isinstance(value, list):
            for k, item in enumerate(value):
                walk(item, (*path, str(k)))
        elif isinstance(value, str) and value.startswith(HF_HUB):
            found.append((" -> ".join(path), value))

    walk(entry.spec, ("spec",))
    return found


def _read_zoo_files() -> dict[str, dict[str, Any]]:
    raw: dict[str, dict[str, Any]] = {}
    for resource in sorted(zoo_folder().iterdir(), key=lambda r: r.name):
        if not resource.name.endswith(".toml") or resource.name == PLUGINS_FILE:
            continue
        tables = _checked_tables(tomllib.loads(resource.read_text(encoding="utf-8")), resource.name)
        for name, table in tables.items():
            if name in raw:
                raise ValueError(f"zoo entry '{name}' is defined twice (second time in {resource.name}).")
            raw[name] = table
    return raw


def _checked_tables(data: dict[str, Any], where: str) -> dict[str, dict[str, Any]]:
    for name, table in data.items():
        unknown = set(table) - ENTRY_KEYS if isinstance(table, dict) else {"<not a table>"}
        if unknown:
            raise ValueError(f"zoo entry '{name}' ({where}) has unknown keys {sorted(unknown)}.")
    return data


def _resolve(name: str, raw: dict[str, dict[str, Any]], seen: tuple[str, ...] = ()) -> dict[str, Any]:
    if name in seen:
        raise ValueError(f"zoo entries {' -> '.join(seen + (name,))} form a cycle of bases.")
    table = copy.deepcopy(raw[name])
    base_name = table.pop("base", None)
    if base_name is None:
        if "spec" not in table:
            raise ValueError(f"zoo entry '{name}' has neither a spec nor a base entry.")
        return table
    if not isinstance(base_name, str) or base_name not in raw:
        raise ValueError(f"zoo entry '{name}' names the unknown base '{base_name}'.")
    if not isinstance(table.get("overrides", {}), dict):
        raise ValueError(f"zoo entry '{name}': overrides must be a table of the base's spec, got {table['overrides']!r:.60}.")
    return inherit(_resolve(base_name, raw, seen + (name,)), table)


def inherit(base: dict[str, Any], table: dict[str, Any]) -> dict[str, Any]:
    """The fields of an entry that names ``base`` (the base's resolved fields): its
    ``overrides`` merged into the base's spec, its other fields over the base's.

    The paper's figures and the weights belong to one trained model and are not inherited;
    everything else, the parameter count included, holds until the entry says otherwise (a
    test recounts params).

    Example:
        >>> inherit({"spec": {"pooler": {"name": "MrSw"}}, "paper": "P", "weights": [{"source": "w"}]},
        ...         {"overrides": {"pooler": {"name": "Symm"}}, "description": "d"})
        {'paper': 'P', 'description': 'd', 'spec': {'pooler': {'name': 'Symm'}}}
    """
    base, table = copy.deepcopy(base), {k: v for k, v in table.items() if k != "base"}
    for key in ("metrics", "weights"):
        base.pop(key, None)
    spec = merge(base.pop("spec"), table.pop("overrides", {}))
    return {**base, **table, "spec": spec}


def params_leave_out_vocabulary(spec: dict[str, Any]) -> bool:
    """Whether ``params`` leaves out the text encoder's word-embedding table: true when the
    encoder takes a ``vocab`` (built from a caption corpus, so its size is not in the spec).

    Example:
        >>> params_leave_out_vocabulary({"text_encoder": {"name": "bigru"}})
        True
    """
    try:
        # read from the builder's source where it is not imported yet: a card needs no torch
        return "vocab" in get_registry("text_encoders").parameter_names(spec["text_encoder"]["name"])
    except (RegistryError, KeyError, TypeError):
        return False


def format_params(params: int, spec: dict[str, Any], note: str = " (without the word-embedding table)") -> str:
    """``params`` in millions, e.g. ``212.0 M``, followed by ``note`` when it leaves out the
    word-embedding table."""
    text = f"{params / 1e6:.1f} M"
    return text + note if params_leave_out_vocabulary(spec) else text


def builtin_entries() -> list[ZooEntry]:
    """All entries of xmatch's zoo folder (:func:`~xmatch.core.sources.zoo_folder`)."""
    raw = _read_zoo_files()
    return [ZooEntry(name=name, **_resolve(name, raw)) for name in raw]


def zoo_entries_from_toml(package: str, resource: str = "zoo.toml") -> dict[str, ZooEntry]:
    """The zoo entries of a TOML file shipped inside ``package``, in the layout of xmatch's
    own ``zoo/*.toml`` (one table per entry; an entry with a ``base`` states only what differs
    from it: its ``overrides`` of the base's spec and the fields it changes; the paper's figures
    and the weights are not inherited). For plugins: point each entry point of
    the group ``xmatch_models`` at one of the returned entries.

    Raises:
        ZooError: the file is not UTF-8 TOML, or an entry is malformed (unknown keys, fields of
            the wrong type, an unknown base, a cycle of bases); the message names the file.

    Example:
        >>> entries = zoo_entries_from_toml("xmatch_scan", "zoo.toml")  # the SCAN plugin's entries
        >>> entries["scan-t2i-avg-f30k"].dataset
        'f30k'
    """
    where = f"{package}/{resource}"
    try:
        text = importlib.resources.files(package).joinpath(resource).read_text(encoding="utf-8")
        raw = _checked_tables(tomllib.loads(text), where)
        return {name: ZooEntry(name=name, **_resolve(name, raw)) for name in raw}
    except (UnicodeDecodeError, tomllib.TOMLDecodeError, RecursionError, TypeError, ValueError) as exc:
        message = str(exc) if where in str(exc) else f"{where}: {exc}"
        raise ZooError(message) from None


_RESOLVING: list[str] = []  # the entries whose bases are being looked up, outermost first


def as_entry(name: str, obj: Any) -> ZooEntry:
    """Accept a ZooEntry, a dict of entry fields, or a callable returning either (plugins).

    A dict may name a registered ``base`` entry and give ``overrides`` of its spec, as the
    entries of a zoo TOML file do (:func:`inherit`).

    Example:
        >>> entry = as_entry("teran-symm-scenes", {"base": "teran-mrsw-scenes", "overrides": {"pooler": {"name": "Symm"}}})
        >>> entry.spec["pooler"]["name"], entry.dataset, entry.weights
        ('Symm', 'scenes', [])
    """
    if callable(obj) and not isinstance(obj, ZooEntry):
        obj = obj()
    if isinstance(obj, ZooEntry):
        return copy.deepcopy(obj)  # callers may edit the spec they get; the registered entry stays
    if isinstance(obj, dict) and "base" in obj:
        unknown = set(obj) - ENTRY_KEYS - {"name"}
        if unknown:
            raise ValueError(f"zoo entry '{name}' has unknown keys {sorted(unknown)}.")
        if name in _RESOLVING:
            raise ValueError(f"zoo entries {' -> '.join([*_RESOLVING, name])} form a cycle of bases.")
        _RESOLVING.append(name)
        try:
            base = info(obj["base"])
        except RegistryError as exc:
            raise ValueError(f"zoo entry '{name}' names the unknown base '{obj['base']}': {exc}") from None
        finally:
            _RESOLVING.pop()
        fields = {k: v for k, v in dataclasses.asdict(base).items() if k != "name"}
        return ZooEntry(name=name, **inherit(fields, {k: v for k, v in obj.items() if k != "name"}))
    if isinstance(obj, dict) and "spec" in obj:
        return ZooEntry(name=name, **{k: v for k, v in obj.items() if k != "name"})
    raise TypeError(
        f"zoo entry '{name}' must be a ZooEntry, a dict with a 'spec', or a dict with a 'base', got {type(obj).__name__}."
    )


def match(names: list[str], pattern: str | None) -> list[str]:
    if not pattern:
        return names
    return [n for n in names if fnmatch.fnmatch(n.lower(), pattern.lower())]


def list_models(pattern: str | None = None, *, pretrained: bool = False) -> list[str]:
    """Names of the zoo entries (built-in and from plugins), optionally glob-filtered.

    Args:
        pattern: a glob such as ``"teran-*"`` (None: every entry).
        pretrained: only the entries with published xmatch weights (those that
            ``build(name, pretrained=True)`` loads), as timm's ``list_models(pretrained=True)``.

    Example:
        >>> xmatch.list_models("teran-symm-*")
        ['teran-symm-coco', 'teran-symm-f30k']
        >>> xmatch.list_models("*-scenes", pretrained=True)
        ['teran-mrsw-grid-scenes', 'teran-mrsw-hn-scenes', 'teran-mrsw-scenes', 'tern-scenes']
        >>> xmatch.list_models("siglip*", pretrained=True)
        ['siglip-base-patch16-224', 'siglip-so400m-patch14-384', 'siglip2-base-patch16-224', 'siglip2-so400m-patch14-384']
    """
    names = match(models.names(), pattern)
    return [name for name in names if info(name).weights] if pretrained else names


def info(name: str) -> ZooEntry:
    """The zoo entry ``name``: spec, paper, dataset, metrics, weight sources.

    Example:
        >>> print(xmatch.info("teran-mrsw-coco").metrics["coco-1k"]["t2i_r1"])
        65.0
    """
    return as_entry(models.canonical(name), models.get(name))
