"""Specs: plain data (TOML on disk, dict in Python) that fully describe a model.

Every component is a table with a registered ``name`` and its keyword arguments::

    embed_dim = 1024
    [image_encoder]
    name = "bottomup"
    feature_dim = 2048
    [pooler]
    name = "MrSw"

Arguments are checked against the builder's signature before anything is built; errors
name the path in the spec (``model -> pooler -> name``).
"""

from __future__ import annotations

import copy
import difflib
import inspect
import os
import tomllib
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from xmatch.core.errors import XmatchError
from xmatch.core.registry import RegistryError, get_registry

#: spec key -> registry kind of the component tables of a model spec
COMPONENTS: dict[str, str] = {
    "image_encoder": "image_encoders",
    "text_encoder": "text_encoders",
    "image_reasoner": "reasoners",
    "text_reasoner": "reasoners",
    "pooler": "poolers",
    "loss": "losses",
    "verifier": "verifiers",
}
#: components a spec may leave out: without a loss the model encodes and scores (inference);
#: without a verifier it has no second-stage re-ranker (``model.verify``)
OPTIONAL_COMPONENTS = ("loss", "verifier")
#: top-level scalar keys of a model spec and their defaults
MODEL_OPTIONS: dict[str, Any] = {
    "embed_dim": 1024,
    "shared_reasoner": False,
    # False: the encoder's output is used as is (its width must be embed_dim), for models whose
    # paper has no layer between encoder and scoring (SCAN's text side, VSE++)
    "image_projection": True,
    "text_projection": True,
}
#: arguments the model builder passes itself; a spec must not set them
INJECTED: dict[str, tuple[str, ...]] = {"image_reasoner": ("dim",), "text_reasoner": ("dim",), "verifier": ("dim",)}


class SpecError(XmatchError, ValueError):
    """A spec that cannot be built; the message names the path and the fix."""


def load_spec(source: Mapping[str, Any] | str | os.PathLike) -> dict[str, Any]:
    """A spec as a dict, from a dict or a TOML file.

    Example:
        >>> load_spec({"embed_dim": 8})["embed_dim"]
        8
    """
    if isinstance(source, Mapping):
        return copy.deepcopy(dict(source))
    path = Path(source)
    if not path.is_file():
        raise SpecError(f"spec file {path} does not exist.")
    try:
        with path.open("rb") as f:
            return tomllib.load(f)
    except tomllib.TOMLDecodeError as exc:
        raise SpecError(f"spec file {path} is not valid TOML: {exc}") from exc


def merge(spec: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """Nested update of ``spec`` by ``overrides``.

    A component table whose ``name`` changes is replaced as a whole (the old arguments belong
    to the old component); otherwise tables are merged key by key.

    Example:
        >>> merge({"pooler": {"name": "MrSw", "compat": "clean"}}, {"pooler": {"name": "Symm"}})
        {'pooler': {'name': 'Symm'}}
    """
    out = copy.deepcopy(dict(spec))
    for key, value in overrides.items():
        current = out.get(key)
        if isinstance(value, Mapping) and isinstance(current, Mapping):
            renamed = "name" in value and str(value["name"]).lower() != str(current.get("name", "")).lower()
            out[key] = copy.deepcopy(dict(value)) if renamed else merge(current, value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def signature_of(builder: Callable[..., Any]) -> inspect.Signature:
    target = builder.__init__ if inspect.isclass(builder) else builder
    sig = inspect.signature(target)
    params = [p for i, p in enumerate(sig.parameters.values()) if not (inspect.isclass(builder) and i == 0)]
    return sig.replace(parameters=params)


def _type_hints(builder: Callable[..., Any]) -> dict[str, Any]:
    target = builder.__init__ if inspect.isclass(builder) else builder
    try:
        return typing.get_type_hints(target)
    except Exception:  # unresolved forward references: skip type checks, keep name checks
        return {}


def _matches(value: Any, hint: Any) -> bool:
    if hint is Any or hint is inspect.Parameter.empty:
        return True
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_matches(value, h) for h in typing.get_args(hint))
    if origin is typing.Literal:
        return value in typing.get_args(hint)
    if hint is type(None):
        return value is None
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if origin in (dict, Mapping) or hint is dict:
        return isinstance(value, Mapping)
    if origin in (list, tuple, Sequence) or hint in (list, tuple):
        return isinstance(value, (list, tuple))
    if isinstance(hint, type):
        return isinstance(value, hint)
    return True


def _whole_hint(value: Any, hint: Any) -> str:
    """For a whole-number float given where an int is expected (``1e7``, ``512.0``), how to
    write it as an int; a float is never rounded into an int silently."""
    if isinstance(value, float) and value.is_integer() and _matches(1, hint) and not _matches(value, hint):
        return f" Write {int(value)}: an int has no decimal point or exponent (TOML also reads 10_000_000)."
    return ""


def _describe(hint: Any) -> str:
    return getattr(hint, "__name__", None) or str(hint).replace("typing.", "")


def check_component(table: Any, kind: str, path: str, injected: tuple[str, ...] = ()) -> dict[str, Any]:
    """Validate one component table against its builder; return it with defaults filled in
    and the registered spelling of its name."""
    if not isinstance(table, Mapping):
        raise SpecError(f"{path}: expected a table with a registered 'name', got {table!r}.")
    if "name" not in table:
        raise SpecError(f"{path} -> name: missing; every component table names a registered {kind[:-1]}.")
    registry = get_registry(kind)
    try:
        builder = registry.get(table["name"])
        name = registry.canonical(table["name"])
    except RegistryError as exc:
        raise SpecError(f"{path} -> name: {exc}") from None
    sig = signature_of(builder)
    params = sig.parameters
    var_kw = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    hints = _type_hints(builder)
    known = [p for p in params if p not in injected]
    for key, value in table.items():
        if key == "name":
            continue
        if key in injected:
            raise SpecError(f"{path} -> {key}: set by the model builder; remove it from the spec.")
        if key not in params and not var_kw:
            close = difflib.get_close_matches(key, known, n=3)
            hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
            raise SpecError(
                f"{path} -> {key}: '{name}' has no argument '{key}'.{hint} Arguments: {', '.join(known)}."
            )
        if key in hints and not _matches(value, hints[key]):
            raise SpecError(f"{path} -> {key}: expected {_describe(hints[key])}, got {value!r}.{_whole_hint(value, hints[key])}")
    out: dict[str, Any] = {"name": name}
    for pname, p in params.items():
        if pname in injected or p.kind in (inspect.Parameter.VAR_KEYWORD, inspect.Parameter.VAR_POSITIONAL):
            continue
        if pname in table:
            out[pname] = copy.deepcopy(table[pname])
        elif p.default is inspect.Parameter.empty:
            raise SpecError(f"{path} -> {pname}: required argument of '{name}' is missing.")
        else:
            default = p.default
            out[pname] = list(default) if isinstance(default, tuple) else default
    for key, value in table.items():
        if key not in out and key not in ("name",):
            out[key] = copy.deepcopy(value)
    return out


def check_model_spec(spec: Mapping[str, Any], root: str = "model") -> dict[str, Any]:
    """Validate a whole model spec; return the canonical spec (defaults filled in)."""
    if not isinstance(spec, Mapping):
        raise SpecError(f"{root}: a spec is a table (dict / TOML), got {type(spec).__name__}.")
    allowed = [*COMPONENTS, *MODEL_OPTIONS, "extra_poolers"]
    for key in spec:
        if key not in allowed:
            close = difflib.get_close_matches(key, allowed, n=3)
            hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
            raise SpecError(f"{root} -> {key}: unknown key.{hint} Keys: {', '.join(allowed)}.")
    out: dict[str, Any] = {}
    for key, default in MODEL_OPTIONS.items():
        value = spec.get(key, default)
        if type(value) is not type(default):
            raise SpecError(
                f"{root} -> {key}: expected {type(default).__name__}, got {value!r}.{_whole_hint(value, type(default))}"
            )
        out[key] = value
    if out["embed_dim"] <= 0:
        raise SpecError(f"{root} -> embed_dim: must be positive, got {out['embed_dim']}.")
    for key, kind in COMPONENTS.items():
        if key in OPTIONAL_COMPONENTS and spec.get(key) is None:
            continue  # build(..., loss=None): an inference model
        if key not in spec:
            if key == "text_reasoner" and out["shared_reasoner"]:
                continue
            raise SpecError(f"{root} -> {key}: missing; a model spec needs a [{key}] table.")
        if key == "text_reasoner" and out["shared_reasoner"]:
            if dict(spec[key]) == dict(spec.get("image_reasoner", {})):
                continue  # the same table twice: sharing changes nothing in it
            raise SpecError(
                f"{root} -> text_reasoner: shared_reasoner = true uses image_reasoner for both "
                "modalities; remove text_reasoner or set shared_reasoner = false."
            )
        out[key] = check_component(spec[key], kind, f"{root} -> {key}", INJECTED.get(key, ()))
    extra = spec.get("extra_poolers", {})
    if not isinstance(extra, Mapping):
        raise SpecError(f"{root} -> extra_poolers: expected a table of named pooler tables.")
    if "main" in extra:
        raise SpecError(f"{root} -> extra_poolers -> main: 'main' is the model's pooler; pick another name.")
    out["extra_poolers"] = {
        k: check_component(v, "poolers", f"{root} -> extra_poolers -> {k}") for k, v in extra.items()
    }
    return out


def instantiate(table: Mapping[str, Any], kind: str, **injected: Any) -> Any:
    """Build a validated component table."""
    builder = get_registry(kind).get(table["name"])
    kwargs = {k: v for k, v in table.items() if k != "name"}
    return builder(**kwargs, **injected)
