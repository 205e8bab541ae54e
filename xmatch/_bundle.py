"""Model bundles: safetensors weights with the spec in the metadata, plus text-side assets."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from typing import Any

import torch

from xmatch.spec import merge

WEIGHTS_FILE = "model.safetensors"
FORMAT = "xmatch.model/1"


def _version() -> str:
    from xmatch import __version__

    return __version__


def save_pretrained(model: torch.nn.Module, directory: str | os.PathLike, dtype: torch.dtype | None = None) -> Path:
    """Write ``model`` as a bundle: ``model.safetensors`` (spec and version in the metadata)
    and the text encoder's assets (tokenizer / vocabulary). Load it with
    ``xmatch.build("local-dir:DIR")``.

    Args:
        model: the model to save (left unchanged).
        directory: the bundle folder (created).
        dtype: store the floating-point tensors in this dtype, e.g. ``torch.float16`` to halve
            the file; loading casts them to the model's dtype. Default: as they are.

    Example:
        >>> xmatch.save_pretrained(model, "my-model")  # doctest: +SKIP
        >>> xmatch.build("local-dir:my-model")  # doctest: +SKIP
    """
    from safetensors.torch import save_model

    if dtype is not None and not dtype.is_floating_point:
        raise ValueError(f"dtype must be a floating-point dtype such as torch.float16, got {dtype}.")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    assets = model.text_encoder.save_assets(directory)
    spec = merge(model.spec, {"text_encoder": assets}) if assets else model.spec
    metadata = {
        "format": FORMAT,
        "xmatch_version": _version(),
        "spec": json.dumps(spec),
        "assets": json.dumps({"text_encoder": sorted(k for k, v in assets.items() if isinstance(v, str))}),
    }
    tmp = directory / (WEIGHTS_FILE + ".partial")
    # a cast copy: the caller's model keeps its precision
    save_model(copy.deepcopy(model).to(dtype) if dtype is not None else model, str(tmp), metadata=metadata)
    os.replace(tmp, directory / WEIGHTS_FILE)
    return directory


def read_bundle_spec(directory: str | os.PathLike) -> tuple[dict[str, Any], Path]:
    """The spec stored in a bundle, with its asset paths made absolute, and the weights path."""
    from safetensors import safe_open

    directory = Path(directory)
    weights = directory / WEIGHTS_FILE
    if not weights.is_file():
        raise FileNotFoundError(
            f"local-dir:{directory}: no {WEIGHTS_FILE} there; a bundle is written by xmatch.save_pretrained."
        )
    try:
        with safe_open(str(weights), framework="pt") as f:
            meta = f.metadata() or {}
    except Exception as exc:
        raise ValueError(f"{weights} is not a readable safetensors file ({exc}); download or save it again.") from exc
    if meta.get("format") != FORMAT or "spec" not in meta:
        raise ValueError(f"{weights} has no xmatch spec in its metadata; it was not written by save_pretrained.")
    spec = json.loads(meta["spec"])
    for component, keys in json.loads(meta.get("assets", "{}")).items():
        for key in keys:
            spec[component][key] = str(directory / spec[component][key])
    return spec, weights


def load_weights(model: torch.nn.Module, path: str | os.PathLike) -> None:
    """Load safetensors weights strictly: missing, unexpected or mis-shaped tensors are errors."""
    from safetensors import safe_open
    from safetensors.torch import load_model

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"weights file {path} does not exist.")
    try:
        with safe_open(str(path), framework="pt") as f:
            keys = set(f.keys())
    except Exception as exc:
        raise ValueError(f"{path} is not a readable safetensors file ({exc}); it may be truncated.") from exc
    expected = set(model.state_dict())
    missing, unexpected = _diff_keys(model, expected, keys)
    if missing or unexpected:
        raise ValueError(
            f"{path} does not fit this model: missing {sorted(missing)[:10]}"
            f"{' ...' if len(missing) > 10 else ''}, unexpected {sorted(unexpected)[:10]}"
            f"{' ...' if len(unexpected) > 10 else ''}. Build the model from the same spec as the weights."
        )
    try:
        load_model(model, str(path), strict=True, device=str(next(model.parameters()).device))
    except RuntimeError as exc:
        raise ValueError(f"{path} does not fit this model: {exc}") from exc


def _diff_keys(model: torch.nn.Module, expected: set[str], found: set[str]) -> tuple[set[str], set[str]]:
    """Missing / unexpected keys, treating tied (shared) tensors as present if one alias is."""
    by_storage: dict[int, set[str]] = {}
    for name, tensor in model.state_dict(keep_vars=True).items():
        by_storage.setdefault(id(tensor), set()).add(name)
    missing = {k for k in expected - found if not (by_storage_of(k, by_storage) & found)}
    return missing, found - expected


def by_storage_of(key: str, groups: dict[int, set[str]]) -> set[str]:
    for names in groups.values():
        if key in names:
            return names
    return {key}
