"""Model bundles: safetensors weights with the spec in the metadata, plus text-side assets."""

from __future__ import annotations

import copy
import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from xmatch.core.sources import WEIGHTS_FILE
from xmatch.io.files import move_into_place
from xmatch.io.safe_load import load_json
from xmatch.core.errors import XmatchError
from xmatch.core.spec import COMPONENTS, OPTIONAL_COMPONENTS, merge

FORMAT = "xmatch.model/1"
#: the metadata entry of a verifier head's own validation (:func:`read_verifier_validation`)
VERIFIER_VALIDATION = "verifier_validation"
#: set to 1 to load weights that hold NaN or infinite values (research on a diverged run)
ENV_ALLOW_NONFINITE = "XMATCH_ALLOW_NONFINITE_WEIGHTS"


class BundleError(XmatchError, ValueError):
    """A bundle's ``model.safetensors`` (or any safetensors weights file) cannot be used:
    unreadable, malformed metadata, an asset path that leaves the bundle, or tensors that do
    not fit the model. The message names the file."""


class NonFiniteWeightsError(BundleError):
    """Weights that hold NaN or infinite values (a diverged run, a damaged file); the message
    names the file and the tensor."""


_RESAVE = "The bundle is damaged or was not written by xmatch.save_pretrained; save or download it again."


def _version() -> str:
    from xmatch.core.version import __version__

    return __version__


def save_pretrained(
    model: torch.nn.Module,
    directory: str | os.PathLike,
    dtype: torch.dtype | None = None,
    *,
    verifier_validation: Mapping[str, Any] | None = None,
) -> Path:
    """Write ``model`` as a bundle: ``model.safetensors`` (spec and version in the metadata)
    and the text encoder's assets (tokenizer / vocabulary). Load it with
    ``xmatch.build("local-dir:DIR", pretrained=True)``.

    Args:
        model: the model to save (left unchanged).
        directory: the bundle folder (created).
        dtype: store the floating-point tensors in this dtype, e.g. ``torch.float16`` to halve
            the file; loading casts them to the model's dtype. Default: as they are.
        verifier_validation: the verifier head's own validation (what the trainer measures:
            accuracy, chance level, split...), kept in the metadata so that re-ranking with
            the head can tell a head that learned nothing (:func:`read_verifier_validation`).

    Example:
        >>> model = xmatch.build("teran-mrsw-scenes")
        >>> xmatch.save_pretrained(model, "my-model")
        PosixPath('my-model')
        >>> loaded = xmatch.build("local-dir:my-model", pretrained=True)
        >>> all(torch.equal(a, b) for a, b in zip(loaded.state_dict().values(), model.state_dict().values()))
        True
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
    if verifier_validation is not None:
        metadata[VERIFIER_VALIDATION] = json.dumps(dict(verifier_validation))
    tmp = directory / (WEIGHTS_FILE + ".partial")
    # a cast copy: the caller's model keeps its precision
    save_model(_owning_storages(copy.deepcopy(model).to(dtype) if dtype is not None else model), str(tmp), metadata=metadata)
    move_into_place(tmp, directory / WEIGHTS_FILE)
    return directory


def _owning_storages(model: torch.nn.Module) -> torch.nn.Module:
    """``model``, or a copy of it in which every parameter and buffer that is a view into a
    larger storage owns its own: safetensors refuses such views (on a GPU, cuDNN keeps all of an
    RNN's weights in one flat buffer, so a Bi-GRU trained there could not be saved). Tensors
    that share a whole storage (tied weights, a shared reasoner) stay shared: safetensors
    stores them once.

    Example:
        >>> flat = torch.zeros(6)
        >>> lin = torch.nn.Linear(2, 2)
        >>> lin.weight.data, lin.bias.data = flat[:4].view(2, 2), flat[4:]
        >>> owned = _owning_storages(lin)
        >>> owned is not lin, owned.weight.untyped_storage().nbytes() == 16, torch.equal(owned.weight, lin.weight)
        (True, True, True)
    """
    def partial(t: torch.Tensor) -> bool:
        return t.numel() * t.element_size() != t.untyped_storage().nbytes()

    if not any(partial(t) for t in (*model.parameters(), *model.buffers())):
        return model
    owned = copy.deepcopy(model)
    for module in owned.modules():
        for table in (module._parameters, module._buffers):
            for name, tensor in table.items():
                if tensor is not None and partial(tensor):
                    tensor.data = tensor.data.clone()
    return owned


def read_bundle_spec(directory: str | os.PathLike) -> tuple[dict[str, Any], Path]:
    """The spec stored in a bundle, with its asset paths made absolute, and the weights path.

    A bundle's asset paths (tokenizer, vocabulary) must stay inside the bundle: an absolute
    path or one that climbs out with ``..`` is refused, and so is such a path anywhere in the
    text encoder's table (a spec written by the user, outside a bundle, may name any path).

    Raises:
        FileNotFoundError: no ``model.safetensors`` in ``directory``.
        BundleError: the file is unreadable, its metadata is not what ``save_pretrained``
            writes (invalid JSON, missing or unknown entries), or a path leaves the bundle.

    Example:
        >>> xmatch.save_pretrained(xmatch.build("teran-mrsw-scenes"), "my-model")
        PosixPath('my-model')
        >>> spec, weights = read_bundle_spec("my-model")
        >>> spec["text_encoder"]["vocab"]  # the bundle's own copy of the vocabulary
        'my-model/vocab.json'
    """
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
        raise BundleError(f"{weights} is not a readable safetensors file ({exc}); download or save it again.") from None
    if meta.get("format") != FORMAT or "spec" not in meta:
        raise BundleError(f"{weights} has no xmatch spec in its metadata; it was not written by save_pretrained.")
    spec = _metadata_json(meta, "spec", weights)
    if not isinstance(spec, dict):
        raise BundleError(f"{weights}: the spec in its metadata is a {type(spec).__name__}, not a table. {_RESAVE}")
    shared = spec.get("shared_reasoner") is True
    missing = [
        k for k in COMPONENTS
        if not isinstance(spec.get(k), dict) and not (k == "text_reasoner" and shared) and k not in OPTIONAL_COMPONENTS
    ]
    if missing:
        raise BundleError(f"{weights}: the spec in its metadata has no {', '.join(missing)} table. {_RESAVE}")
    assets = _metadata_json(meta, "assets", weights, default="{}")
    for component, key, value in _asset_entries(assets, spec, weights):
        spec[component][key] = str(directory / _inside_path(value, f"{component} -> {key}", weights))
    text_encoder = spec.get("text_encoder")
    if isinstance(text_encoder, dict):
        listed = set(assets.get("text_encoder", ()))
        for key, value in text_encoder.items():
            if key not in listed and isinstance(value, str) and _leaves_bundle(value):
                raise BundleError(
                    f"{weights}: text_encoder -> {key} = {value!r} points outside the bundle; a bundle's "
                    "tokenizer and assets must be inside it (a relative path listed in its assets) or "
                    "a hub name. Save the model again with xmatch.save_pretrained, or build it from "
                    f"your own spec with checkpoint='{weights}'."
                )
            if key not in listed and isinstance(value, str) and value and os.path.lexists(directory / value):
                # a file of the bundle that its metadata does not list would be looked up from
                # the working folder (or the Hub) instead of the bundle
                raise BundleError(
                    f"{weights}: text_encoder -> {key} = {value!r} names a file of the bundle that its metadata "
                    f"does not list as an asset. {_RESAVE}"
                )
    return spec, weights


def read_verifier_validation(weights: str | os.PathLike) -> dict[str, Any] | None:
    """The verifier head's validation record that a weights file keeps in its metadata (what
    :func:`save_pretrained` writes with ``verifier_validation``, as ``xmatch train`` does for a
    model with a verifier), or None when it keeps none.

    Raises:
        BundleError: the file is unreadable or the record is not a JSON table.

    Example:
        >>> xmatch.save_pretrained(xmatch.build("teran-mrsw-scenes"), "plain", verifier_validation={"accuracy": 71.0})
        PosixPath('plain')
        >>> read_verifier_validation("plain/model.safetensors")
        {'accuracy': 71.0}
    """
    from safetensors import safe_open

    weights = Path(weights)
    try:
        with safe_open(str(weights), framework="pt") as f:
            meta = f.metadata() or {}
    except Exception as exc:
        raise BundleError(f"{weights} is not a readable safetensors file ({exc}); download or save it again.") from None
    if VERIFIER_VALIDATION not in meta:
        return None
    record = _metadata_json(meta, VERIFIER_VALIDATION, weights)
    if not isinstance(record, dict):
        raise BundleError(f"{weights}: the '{VERIFIER_VALIDATION}' entry of its metadata is not a table. {_RESAVE}")
    return record


def _metadata_json(meta: dict[str, str], key: str, weights: Path, default: str | None = None) -> Any:
    text = meta.get(key, default)
    try:
        return load_json(text, f"the '{key}' entry")
    except (TypeError, ValueError) as exc:  # JsonDepthError is a ValueError too
        raise BundleError(
            f"{weights}: the '{key}' entry of its metadata is not valid JSON ({exc}). {_RESAVE}"
        ) from None


def _asset_entries(assets: Any, spec: dict[str, Any], weights: Path) -> list[tuple[str, str, Any]]:
    """``(component, key, path)`` for every asset the metadata lists, each checked against the spec."""
    if not isinstance(assets, dict) or not all(isinstance(keys, list) for keys in assets.values()):
        raise BundleError(
            f"{weights}: the 'assets' entry of its metadata must map components to lists of keys, "
            f"got {json.dumps(assets)[:200]}. {_RESAVE}"
        )
    entries = []
    for component, keys in assets.items():
        table = spec.get(component)
        for key in keys:
            if not isinstance(table, dict) or not isinstance(key, str) or key not in table:
                raise BundleError(
                    f"{weights}: its metadata lists the asset {component} -> {key!r}, which its spec does "
                    f"not have. {_RESAVE}"
                )
            entries.append((component, key, table[key]))
    return entries


def _inside_path(value: Any, where: str, weights: Path) -> str:
    """An asset path relative to the bundle that does not climb out of it."""
    if not isinstance(value, str) or not value:
        raise BundleError(f"{weights}: the asset {where} must be a path inside the bundle, got {value!r}. {_RESAVE}")
    if _leaves_bundle(value):
        raise BundleError(
            f"{weights}: the asset {where} = {value!r} points outside the bundle; asset paths are "
            f"relative to the bundle folder and stay inside it. {_RESAVE}"
        )
    return value


def _leaves_bundle(path: str) -> bool:
    """Whether a path read from a bundle is absolute, home-relative, a file URL or climbs with ``..``.

    Checked on the text only: symbolic links inside a bundle are allowed, as huggingface_hub's
    cache links every file of a snapshot to its blob.
    """
    parts = path.replace("\\", "/").split("/")
    return (
        os.path.isabs(path) or path.startswith(("/", "\\", "~", "file:")) or bool(re.match(r"[A-Za-z]:", path))
        or ".." in parts
    )


def load_weights(
    model: torch.nn.Module, path: str | os.PathLike, fresh: tuple[str, ...] = (), *, allow_nonfinite: bool | None = None
) -> None:
    """Load safetensors weights strictly: missing, unexpected or mis-shaped tensors are errors,
    and so are NaN or infinite values (:func:`check_finite_weights`).

    ``fresh`` names parts the caller added to a model whose weights predate them (key
    prefixes such as ``"verifier."``): the file may lack their tensors, which keep their
    initialisation, as transformers does for a newly added head. Anything else missing is
    still an error.

    ``allow_nonfinite=True`` loads weights with NaN or infinite values (research on a diverged
    run); the default None reads ``XMATCH_ALLOW_NONFINITE_WEIGHTS=1`` from the environment, the
    switch that reaches every loader (``xmatch.build``, the command line, a resumed run).

    Raises:
        FileNotFoundError: no such file.
        BundleError: the file is not readable safetensors or does not fit ``model`` (named).
        NonFiniteWeightsError: a tensor holds NaN or infinite values (named).
    """
    from safetensors import SafetensorError, safe_open
    from safetensors.torch import load_model

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"weights file {path} does not exist.")
    try:
        with safe_open(str(path), framework="pt") as f:
            keys = set(f.keys())
    except Exception as exc:
        raise BundleError(f"{path} is not a readable safetensors file ({exc}); it may be truncated.") from exc
    expected = set(model.state_dict())
    missing, unexpected = _diff_keys(model, expected, keys)
    added = {k for k in missing if k.startswith(fresh)} if fresh else set()
    missing -= added
    names = upstream_names(model, keys) if missing or unexpected else {}
    if names:
        _load_upstream(model, path, names, expected)
        check_finite_weights(model, path, allow_nonfinite)
        return
    if getattr(model, "loss", False) is None:  # an inference build: a training build's loss state is not read
        unexpected = {k for k in unexpected if not k.startswith("loss.")}
    if missing or unexpected:
        raise BundleError(
            f"{path} does not fit this model: missing {sorted(missing)[:10]}"
            f"{' ...' if len(missing) > 10 else ''}, unexpected {sorted(unexpected)[:10]}"
            f"{' ...' if len(unexpected) > 10 else ''}. Build the model from the same spec as the weights."
        )
    try:
        # the keys were compared above; a loss-less model leaves the file's loss tensors unread
        strict = getattr(model, "loss", False) is not None and not added
        load_model(model, str(path), strict=strict, device=str(next(model.parameters()).device))
    except (RuntimeError, SafetensorError) as exc:
        raise BundleError(f"{path} does not fit this model: {exc}") from exc
    check_finite_weights(model, path, allow_nonfinite)


def nonfinite_allowed(allow: bool | None = None) -> bool:
    """Whether weights with NaN or infinite values may load: ``allow`` when given, else
    ``XMATCH_ALLOW_NONFINITE_WEIGHTS`` (``1``, ``true``, ``yes``, ``on``).

    Example:
        >>> nonfinite_allowed(True), nonfinite_allowed(False)
        (True, False)
    """
    if allow is not None:
        return allow
    return os.environ.get(ENV_ALLOW_NONFINITE, "").strip().lower() in ("1", "true", "yes", "on")


def nonfinite_tensors(tensors: Any, prefix: str = "") -> list[tuple[str, int, int, int]]:
    """``(name, NaN count, infinite count, size)`` of every floating-point tensor with a non-finite
    value in ``tensors``: a tensor, or dicts and lists of them (a state dict, an optimizer's
    state), named by their keys joined with ``.``. One sum per tensor (a NaN or infinity makes
    it non-finite); the element-wise check and the counts only where the sum is not finite.

    Example:
        >>> nonfinite_tensors({"w": torch.tensor([1.0, float("nan")]), "n": torch.tensor([1]), "s": [torch.ones(2)]})
        [('w', 1, 0, 2)]
    """
    found: list[tuple[str, int, int, int]] = []
    if isinstance(tensors, torch.Tensor):
        # a NaN or infinity anywhere makes the sum non-finite: one vectorised pass; only a
        # non-finite sum (or one that overflowed) is looked at element by element
        inexact = tensors.is_floating_point() or tensors.is_complex()
        if inexact and not bool(torch.isfinite(tensors.sum())) and not bool(torch.isfinite(tensors).all()):
            nan = int(torch.isnan(tensors).sum())
            found.append((prefix, nan, int((~torch.isfinite(tensors)).sum()) - nan, tensors.numel()))
    elif isinstance(tensors, dict):
        for key, value in tensors.items():
            found += nonfinite_tensors(value, f"{prefix}.{key}" if prefix else str(key))
    elif isinstance(tensors, (list, tuple)):
        for k, value in enumerate(tensors):
            found += nonfinite_tensors(value, f"{prefix}.{k}" if prefix else str(k))
    return found


def check_finite_weights(model: torch.nn.Module, source: str | os.PathLike, allow: bool | None = None) -> None:
    """Refuse a model whose weights (as loaded from ``source``) hold NaN or infinite values:
    every score it computed would be NaN or rank one item first, silently.

    Args:
        model: the model, its weights loaded.
        source: where they came from, for the message.
        allow: True loads them anyway (see :func:`nonfinite_allowed`).

    Raises:
        NonFiniteWeightsError: a tensor holds NaN or infinite values; the message names it,
            the file, and how many more tensors do.

    Example:
        >>> lin = torch.nn.Linear(2, 1)
        >>> _ = torch.nn.init.constant_(lin.bias, float("inf"))
        >>> check_finite_weights(lin, "lin.safetensors")
        Traceback (most recent call last):
        ...
        xmatch.io.bundle.NonFiniteWeightsError: lin.safetensors holds non-finite weights: tensor 'bias' has 0 NaN and 1 infinite of its 1 values. ...
    """
    if nonfinite_allowed(allow):
        return
    found = nonfinite_tensors(model.state_dict())
    if found:
        raise NonFiniteWeightsError(nonfinite_message(source, found, "weights"))


def nonfinite_message(source: str | os.PathLike, found: list[tuple[str, int, int, int]], what: str) -> str:
    """The refusal of :func:`check_finite_weights` (also used for a trainer state's tensors)."""
    name, nan, inf, size = found[0]
    more = f" (and {len(found) - 1} more tensors)" if len(found) > 1 else ""
    return (
        f"{source} holds non-finite {what}: tensor '{name}' has {nan} NaN and {inf} infinite of its "
        f"{size} values{more}. They come from a diverged run or a damaged file; "
        f"use weights saved before the divergence (an earlier checkpoint), or set {ENV_ALLOW_NONFINITE}=1 "
        "to load them anyway for research."
    )


def upstream_names(model: torch.nn.Module, keys: set[str]) -> dict[str, str | None]:
    """``{key of the file: key of the model}`` for a checkpoint in the layout of the library an
    encoder wraps (``transformers``' ``CLIPModel`` / ``SiglipModel`` ``model.safetensors`` for
    the clip-family towers), so that a zoo entry's weights can be the upstream file itself,
    verified by its sha256. Each direct child module that reads such a layout names its own
    tensors with ``upstream_names(keys) -> {file key: its key, or None to skip}``; empty when
    none does (every xmatch bundle).

    Example:
        >>> upstream_names(xmatch.build("teran-mrsw-scenes"), {"vision_model.embeddings.class_embedding"})
        {}
    """
    names: dict[str, str | None] = {}
    for child_name, child in model.named_children():
        claim = getattr(child, "upstream_names", None)
        if callable(claim):
            names.update({k: None if v is None else f"{child_name}.{v}" for k, v in claim(keys).items()})
    return names


def _load_upstream(model: torch.nn.Module, path: Path, names: dict[str, str | None], expected: set[str]) -> None:
    """Load an upstream checkpoint renamed by :func:`upstream_names`, as strictly as a bundle:
    every tensor of the model comes from the file (a loss's learned temperature excepted: it
    keeps its initial value when the file has none), and every tensor of the file is read (its
    own temperature excepted, when the model's loss learns none)."""
    from safetensors import safe_open

    state: dict[str, torch.Tensor] = {}
    with safe_open(str(path), framework="pt") as f:
        unread = sorted(set(f.keys()) - set(names) - {"logit_scale", "logit_bias"})
        for key, target in names.items():
            if target is not None:
                state[target] = f.get_tensor(key)
    missing = sorted(k for k in expected - set(state) if not k.startswith("loss."))
    if missing or unread:
        parts = [f"the model's {_few(missing)} are not in it"] if missing else []
        parts += [f"its {_few(unread)} belong to no part of the model"] if unread else []
        raise BundleError(
            f"{path} holds upstream tower weights that do not fit this model: {'; '.join(parts)}. Load it into the "
            "architecture of the zoo entry it belongs to (its towers, identity reasoners, no projection)."
        )
    try:
        model.load_state_dict(state, strict=False)
    except RuntimeError as exc:  # a tensor of another shape: another size of the same family
        raise BundleError(f"{path} does not fit this model: {exc}") from exc


def _few(keys: list[str]) -> str:
    return f"{keys[:10]}{' ...' if len(keys) > 10 else ''}"


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
