"""Read the original TERN / TERAN research checkpoints (mesnico/TERN, mesnico/TERAN).

A checkpoint is the dict ``train.py:save_checkpoint`` writes: ``model`` (state_dict),
``config`` (the YAML dict), ``opt`` (an ``argparse.Namespace``) and training state, in the
legacy torch serialisation. It is read with ``weights_only=True`` and ``Namespace``
allow-listed: nothing else is unpickled.

A TERAN checkpoint converts to its alignment pooler in the ``original`` compatibility mode
(REFERENCE.md): the pooler zero-fills before the max and the text encoder leaves the last
word-piece out of the alignment, so scores equal the original code's. A TERN checkpoint
(``configs/tern.yaml``: no ``loss-type``, no ``alignment-mode``) converts to the cosine of the
image and text CLS outputs with one shared reasoner, which is what TERN's evaluation ranks by.
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from xmatch.core.sources import BERT_BASE_UNCASED

ALIGNMENT_POOLERS = {"MrSw": "MrSw", "MwSr": "MwSr", "symm": "Symm", "MrAVGw": "MrAvgw"}
PREFIX = "img_txt_enc."
SECTIONS = ("text-model", "image-model", "model", "training")

#: original key pattern -> xmatch key template; None drops modules the original computes but
#: never uses (BERT pooler, the mean-pooled ``map`` / ``fc`` heads, the embedding alias).
KEY_RULES: list[tuple[str, str | None]] = [
    (r"txt_enc\.bert_model\.pooler\..*", None),
    (r"txt_enc\.bert_model\.embeddings\.position_ids", None),
    (r"txt_enc\.bert_model\.(.*)", r"text_encoder.model.\1"),
    (r"txt_enc\.word_embeddings\.weight", None),
    (r"txt_enc\.map\..*", None),
    (r"img_enc\.fc\..*", None),
    (r"img_enc\.transformer_encoder\.layers\.(.*)", r"image_encoder.transformer.layers.\1"),
    (r"img_enc\.pos_encoding_image\.map\.(.*)", r"image_encoder.box_conditioning.map.\1"),
    (r"img_proj\.(.*)", r"image_projection.\1"),
    (r"cap_proj\.(.*)", r"text_projection.\1"),
    (r"transformer_encoder_1\.layers\.(.*)", r"text_reasoner.layers.\1"),
    (r"transformer_encoder_2\.layers\.(.*)", r"image_reasoner.layers.\1"),
]


def load_original_checkpoint(path: str | os.PathLike) -> dict[str, Any]:
    """Load an original ``.pth`` checkpoint safely (``weights_only=True``, Namespace allowed)."""
    from xmatch.io.safe_load import load_torch_file

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"original checkpoint {path} does not exist.")
    checkpoint = load_torch_file(
        path, what="an original TERN/TERAN checkpoint", allowed_globals=[argparse.Namespace],
        hint="Only the state dict, config and argparse options are accepted.",
    )
    if not isinstance(checkpoint, dict) or "model" not in checkpoint or "config" not in checkpoint:
        raise ValueError(f"{path} is not a TERN/TERAN checkpoint: expected a dict with 'model' and 'config'.")
    return checkpoint


def original_family(config: Any) -> str:
    """Which original code wrote a checkpoint config: ``"tern"`` (mesnico/TERN) or ``"teran"``.

    TERN's ``configs/tern.yaml`` says ``model.name: tern`` and has neither
    ``training.loss-type`` nor ``training.alignment-mode`` (TERN always scores with the CLS
    outputs); TERAN's configs say ``model.name: teran`` and always set ``training.loss-type``.

    Raises:
        ValueError: for a config that is neither, naming what it holds.

    Example:
        >>> original_family({"text-model": {}, "image-model": {}, "model": {"name": "tern"}, "training": {}})
        'tern'
    """
    if not isinstance(config, Mapping):
        raise ValueError(
            f"checkpoint['config'] is a {type(config).__name__}, not the YAML dict that train.py of "
            "mesnico/TERN or mesnico/TERAN saves; this is not an original TERN/TERAN checkpoint."
        )
    missing = [s for s in SECTIONS if not isinstance(config.get(s), Mapping)]
    if missing:
        raise ValueError(_neither(config, f"it has no {', '.join(repr(s) for s in missing)} section"))
    name, training = config["model"].get("name"), config["training"]
    # TERN's code never reads model.name (its get_model always builds TERN); TERAN's needs
    # loss-type. So a config without a name is TERAN's exactly when it has a loss-type.
    if name == "teran" or (name is None and "loss-type" in training):
        return "teran"
    if name in ("tern", None):
        return "tern"
    raise ValueError(_neither(config, f"its model.name is {name!r}"))


def _neither(config: Mapping[str, Any], what: str) -> str:
    model, training = config.get("model"), config.get("training")
    found = [f"sections {sorted(map(str, config))}"]
    if isinstance(model, Mapping):
        found.append(f"model.name {model.get('name')!r}")
    if isinstance(training, Mapping):
        found.append(f"training keys {sorted(map(str, training))}")
    return (
        f"the checkpoint config is neither TERN's nor TERAN's: {what} (found {'; '.join(found)}). "
        "xmatch converts what train.py of mesnico/TERN (model.name 'tern', as configs/tern.yaml) or "
        "mesnico/TERAN (model.name 'teran' with training.loss-type) saves."
    )


def _required(section: Mapping[str, Any], section_name: str, key: str, family: str) -> Any:
    if key not in section:
        raise ValueError(
            f"the {family.upper()} checkpoint config has no {section_name} -> {key}, which the original "
            f"code requires (found {section_name} keys {sorted(map(str, section))}); the file is not a "
            "complete original checkpoint."
        )
    return section[key]


def spec_from_original_config(config: dict[str, Any], bert_source: str) -> dict[str, Any]:
    """The xmatch spec of an original TERN or TERAN YAML config.

    TERAN with ``loss-type: alignment`` gets its alignment pooler in the ``original`` mode
    (zero-fill before the max, the last word-piece left out); TERN, and TERAN trained with a
    ``matching`` loss, score with the cosine of the CLS outputs (``global-cosine``), as their
    evaluation code does.

    Example:
        >>> spec = spec_from_original_config(checkpoint["config"], "bert-base-uncased")  # needs the authors' checkpoint  # doctest: +SKIP
        >>> spec["pooler"]  # a TERN config  # doctest: +SKIP
        {'name': 'global-cosine'}
    """
    family = original_family(config)
    text, image, model, training = (config[k] for k in SECTIONS)
    if text.get("name", "bert") != "bert":
        raise ValueError(f"original text model '{text.get('name')}' is not supported; only 'bert' checkpoints.")
    if text.get("pre-extracted", False):
        raise ValueError(
            "the checkpoint was trained on pre-extracted text features (text-model.pre-extracted: true) "
            "and holds no BERT weights to convert."
        )
    if text.get("layers", 0):
        raise ValueError("original checkpoints with extra text transformer layers (text-model.layers > 0) are not supported.")
    if image.get("name", "bottomup") != "bottomup":
        raise ValueError(f"original image model '{image.get('name')}' is not supported; only 'bottomup' region features.")
    if image.get("pos-encoding", "concat-and-process") != "concat-and-process":
        raise ValueError(f"image-model.pos-encoding '{image.get('pos-encoding')}' is not supported.")
    measure = training.get("measure", "dot")
    if measure != "dot":
        raise ValueError(
            f"training.measure '{measure}' is not supported: only 'dot' (the cosine of unit vectors); "
            "order-embedding checkpoints ('order') score differently."
        )
    if family == "teran":
        loss_type = _required(training, "training", "loss-type", family)
        if not isinstance(loss_type, str) or not ("alignment" in loss_type or "matching" in loss_type):
            raise ValueError(
                f"TERAN training.loss-type {loss_type!r} is not one the original code knows: 'alignment', "
                "'matching' or both."
            )
        # TERAN's evalrank scores with the alignment only for loss-type exactly 'alignment';
        # otherwise with the dot product of the (unit) CLS outputs, as TERN does.
        alignment = loss_type == "alignment"
    else:
        alignment = False
    if alignment:
        mode = training.get("alignment-mode")
        if mode not in ALIGNMENT_POOLERS:
            raise ValueError(
                f"TERAN training.alignment-mode {mode!r} is not one of {sorted(ALIGNMENT_POOLERS)}"
                + (" (the key is missing)." if "alignment-mode" not in training else ".")
            )
        pooler: dict[str, Any] = {"name": ALIGNMENT_POOLERS[mode], "compat": "original"}
    else:
        for key in ("text-aggregation", "image-aggregation"):
            if model.get(key, "first") != "first":
                raise ValueError(
                    f"model.{key} '{model.get(key)}' is not supported: xmatch scores with the CLS outputs "
                    "(aggregation 'first', as configs/tern.yaml)."
                )
        pooler = {"name": "global-cosine"}
    shared = bool(model.get("shared-transformer", False))
    reasoner = {
        "name": "transformer",
        "layers": _required(model, "model", "layers", family),
        "heads": 4,
        "ff_dim": 2048,
        "dropout": model.get("dropout", 0.1),
    }
    spec: dict[str, Any] = {
        "embed_dim": _required(model, "model", "embed-size", family),
        "shared_reasoner": shared,
        "image_encoder": {
            "name": "bottomup",
            "feature_dim": _required(image, "image-model", "feat-dim", family),
            "layers": _required(image, "image-model", "transformer-layers", family),
            "heads": 4,
            "ff_dim": 2048,
            "dropout": image.get("dropout", 0.1),
            "cls_slot": True,
        },
        "text_encoder": {
            "name": "bert",
            "backbone": bert_source,
            "layers": _required(text, "text-model", "extraction-hidden-layer", family),
            "finetune": bool(text.get("fine-tune", True)),
            "pretrained": False,
            "exclude_stopwords": bool(model.get("exclude-stopwords", False)),
            # the [:, 1:-2] slicing exists only in TERAN's alignment loss
            "drop_last_wordpiece": alignment,
        },
        "image_reasoner": reasoner,
        "pooler": pooler,
        "loss": {"name": "hinge", "margin": training.get("margin", 0.2), "max_violation": training.get("max-violation", True)},
    }
    if not shared:
        spec["text_reasoner"] = dict(reasoner)
    return spec


def check_fits(requested: Mapping[str, Any], converted: Mapping[str, Any], name: str, path: str | os.PathLike) -> None:
    """Refuse a checkpoint that converts to another kind of model than ``name`` describes.

    ``build("tern-coco", checkpoint="model_best.pth")`` takes the model from the checkpoint;
    the zoo entry (or spec) only names which model that should be. Their structure must agree:
    encoders, reasoner sharing, pooler, extra poolers and loss. Sizes come from the checkpoint.

    Raises:
        ValueError: naming each difference, the zoo entries the checkpoint fits, and the fix.

    Example:
        >>> check_fits(xmatch.info("tern-coco").spec, converted_spec, "tern-coco", "model_best.pth")  # needs a converted spec  # doctest: +SKIP
    """
    differences = [
        (label, ours, theirs) for label, ours, theirs in _structure(requested, converted) if ours != theirs
    ]
    if not differences:
        return
    from xmatch.core.zoo import info, list_models

    fits = []
    for entry in list_models():
        try:
            spec = info(entry).spec
        except (ValueError, TypeError, KeyError):  # a broken plugin entry must not hide this error
            continue
        if all(ours == theirs for _, ours, theirs in _structure(spec, converted)):
            fits.append(entry)
    fixes = [f"build an entry it fits with checkpoint= ({', '.join(fits)})"] if fits else []
    if all(label in ("pooler", "exclude_stopwords") for label, _, _ in differences):
        overrides: dict[str, Any] = {}
        for label, ours, _ in differences:
            if label == "pooler":  # a renamed pooler table is replaced whole: keep the original mode
                overrides["pooler"] = {"name": ours, **({"compat": "original"} if "compat" in converted["pooler"] else {})}
            else:
                overrides["text_encoder"] = {"exclude_stopwords": ours}
        fixes.append("pass the difference as overrides: " + ", ".join(f"{k}={v!r}" for k, v in overrides.items()))
    listed = "; ".join(f"{label}: {theirs!r} in the checkpoint, {ours!r} in '{name}'" for label, ours, theirs in differences)
    fixes.append(f"convert it on its own: xmatch.convert_original('{path}')")
    raise ValueError(f"{path} does not convert to the model '{name}' describes ({listed}). Either {', or '.join(fixes)}.")


def _structure(requested: Mapping[str, Any], converted: Mapping[str, Any]) -> list[tuple[str, Any, Any]]:
    """(part, requested, converted) for the parts that make a model's kind, not its size."""

    def name_of(table: Any) -> Any:
        return table.get("name") if isinstance(table, Mapping) else table

    def stopwords(spec: Mapping[str, Any]) -> bool:
        table = spec.get("text_encoder")
        return bool(table.get("exclude_stopwords", False)) if isinstance(table, Mapping) else False

    def extra(spec: Mapping[str, Any]) -> dict[str, Any]:
        return {key: name_of(table) for key, table in (spec.get("extra_poolers") or {}).items()}

    return [
        ("image_encoder", name_of(requested.get("image_encoder")), name_of(converted.get("image_encoder"))),
        ("text_encoder", name_of(requested.get("text_encoder")), name_of(converted.get("text_encoder"))),
        ("exclude_stopwords", stopwords(requested), stopwords(converted)),
        ("shared_reasoner", bool(requested.get("shared_reasoner", False)), bool(converted.get("shared_reasoner", False))),
        ("pooler", name_of(requested.get("pooler")), name_of(converted.get("pooler"))),
        ("extra_poolers", extra(requested), extra(converted)),
        ("loss", name_of(requested.get("loss")), name_of(converted.get("loss"))),
    ]


def convert_state_dict(original: dict[str, torch.Tensor], shared_reasoner: bool = False) -> dict[str, torch.Tensor]:
    """Map original state-dict keys to xmatch keys (see :data:`KEY_RULES`).

    Raises:
        ValueError: for a key no rule knows, so nothing is silently dropped.
    """
    out: dict[str, torch.Tensor] = {}
    unknown = []
    for key, tensor in original.items():
        short = key.removeprefix(PREFIX)
        for pattern, template in KEY_RULES:
            m = re.fullmatch(pattern, short)
            if m:
                if template is not None:
                    out[m.expand(template)] = tensor
                break
        else:
            unknown.append(key)
    if unknown:
        raise ValueError(f"original checkpoint has keys the converter does not know: {unknown[:10]}.")
    if shared_reasoner:
        for key in [k for k in out if k.startswith("text_reasoner.")]:
            out["image_reasoner." + key[len("text_reasoner.") :]] = out[key]
    return out


def resolve_bert_source(checkpoint_path: Path, config: dict[str, Any], bert_source: str | None) -> str:
    """The BERT tokenizer/config location: given, or the config's ``pretrain`` next to the file."""
    original_family(config)  # a config of neither kind is reported as such, not as a KeyError
    if bert_source is not None:
        return bert_source
    pretrain = config["text-model"].get("pretrain", "bert-base-uncased")
    beside = checkpoint_path.parent / pretrain
    if beside.is_dir():
        return str(beside)
    # the authors' BERT-base from the Hub at the commit the zoo entries pin, checked on download
    return BERT_BASE_UNCASED if pretrain == "bert-base-uncased" else pretrain
