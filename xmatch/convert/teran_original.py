"""Read the original TERN / TERAN research checkpoints (mesnico/TERN, mesnico/TERAN).

A checkpoint is the dict ``train.py:save_checkpoint`` writes: ``model`` (state_dict),
``config`` (the YAML dict), ``opt`` (an ``argparse.Namespace``) and training state, in the
legacy torch serialisation. It is read with ``weights_only=True`` and ``Namespace``
allow-listed: nothing else is unpickled.

The converted model runs in the ``original`` compatibility mode (REFERENCE.md): the pooler
zero-fills before the max and the text encoder leaves the last word-piece out of the
alignment, so scores equal the original code's.
"""

from __future__ import annotations

import argparse
import os
import re
from pathlib import Path
from typing import Any

import torch

ALIGNMENT_POOLERS = {"MrSw": "MrSw", "MwSr": "MwSr", "symm": "Symm", "MrAVGw": "MrAvgw"}
PREFIX = "img_txt_enc."

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
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"original checkpoint {path} does not exist.")
    try:
        with torch.serialization.safe_globals([argparse.Namespace]):
            checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise ValueError(
            f"{path} could not be read as an original TERN/TERAN checkpoint ({exc}). Only the "
            "state dict, config and argparse options are accepted; the file may be truncated."
        ) from exc
    if not isinstance(checkpoint, dict) or "model" not in checkpoint or "config" not in checkpoint:
        raise ValueError(f"{path} is not a TERN/TERAN checkpoint: expected a dict with 'model' and 'config'.")
    return checkpoint


def spec_from_original_config(config: dict[str, Any], bert_source: str) -> dict[str, Any]:
    """The xmatch spec of an original TERN/TERAN YAML config, in the ``original`` mode."""
    text, image, model, training = (config[k] for k in ("text-model", "image-model", "model", "training"))
    if text.get("name", "bert") != "bert":
        raise ValueError(f"original text model '{text.get('name')}' is not supported; only 'bert' checkpoints.")
    if text.get("layers", 0):
        raise ValueError("original checkpoints with extra text transformer layers (text-model.layers > 0) are not supported.")
    if image.get("pos-encoding", "concat-and-process") != "concat-and-process":
        raise ValueError(f"image-model.pos-encoding '{image.get('pos-encoding')}' is not supported.")
    shared = bool(model.get("shared-transformer", False))
    reasoner = {"name": "transformer", "layers": model["layers"], "heads": 4, "ff_dim": 2048, "dropout": model["dropout"]}
    if training.get("loss-type", "alignment") == "alignment":
        mode = training["alignment-mode"]
        if mode not in ALIGNMENT_POOLERS:
            raise ValueError(f"alignment-mode '{mode}' is not one of {sorted(ALIGNMENT_POOLERS)}.")
        pooler = {"name": ALIGNMENT_POOLERS[mode], "compat": "original"}
    else:
        pooler = {"name": "global-cosine"}
    spec: dict[str, Any] = {
        "embed_dim": model["embed-size"],
        "shared_reasoner": shared,
        "image_encoder": {
            "name": "bottomup",
            "feature_dim": image["feat-dim"],
            "layers": image["transformer-layers"],
            "heads": 4,
            "ff_dim": 2048,
            "dropout": image["dropout"],
            "cls_slot": True,
        },
        "text_encoder": {
            "name": "bert",
            "source": bert_source,
            "layers": text["extraction-hidden-layer"],
            "finetune": bool(text.get("fine-tune", True)),
            "pretrained": False,
            "exclude_stopwords": bool(model.get("exclude-stopwords", False)),
            "drop_last_wordpiece": True,
        },
        "image_reasoner": reasoner,
        "pooler": pooler,
        "loss": {"name": "hinge", "margin": training.get("margin", 0.2), "max_violation": training.get("max-violation", True)},
    }
    if not shared:
        spec["text_reasoner"] = dict(reasoner)
    return spec


def convert_state_dict(original: dict[str, torch.Tensor], shared_reasoner: bool = False) -> dict[str, torch.Tensor]:
    """Map original state-dict keys to xmatch keys (see :data:`KEY_RULES`).

    Raises:
        ValueError: for a key no rule knows, so nothing is silently dropped.
    """
    out: dict[str, torch.Tensor] = {}
    unknown = []
    for key, tensor in original.items():
        short = key[len(PREFIX) :] if key.startswith(PREFIX) else key
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
    if bert_source is not None:
        return bert_source
    pretrain = config["text-model"].get("pretrain", "bert-base-uncased")
    beside = checkpoint_path.parent / pretrain
    return str(beside) if beside.is_dir() else pretrain
