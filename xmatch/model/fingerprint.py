"""The fingerprint of a model's encoders: what decides whether stored embeddings fit a query.

An index keeps token sets made by one model; a query encoded by another model lives in another
space and would be ranked by noise. The fingerprint is a sha256 over what determines the
embeddings: the spec of the encoders, projections and reasoners, and their weights. It leaves
out the pooler and the loss (they score or train, they do not embed: the same index serves
``MrSw`` and ``Symm`` of one model) and the locations of the text encoder's files (the same
bundle loaded from the zoo or from a copied folder has the same fingerprint).
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from typing import Any

from xmatch.model.model import MatchingModel

#: spec keys and top-level modules that do not change the embeddings
SCORING_PARTS = ("pooler", "loss", "extra_poolers")


def embedding_spec(model: MatchingModel) -> dict[str, Any]:
    """The part of ``model.spec`` that decides the embeddings, with the text encoder's asset
    locations (vocabulary, tokenizer folder) left out."""
    try:
        spec = model.spec
    except AttributeError:
        spec = {}
    for key in SCORING_PARTS:
        spec.pop(key, None)
    # save_assets names the spec keys that point at files; their content is not hashed (a
    # tokenizer's files record where they were read from), only the weights are. An encoder
    # that names them as asset_keys is not asked to write (and fetch) its tokenizer.
    assets = getattr(model.text_encoder, "asset_keys", None)
    if assets is None:
        with tempfile.TemporaryDirectory() as tmp:
            assets = model.text_encoder.save_assets(tmp)
    for key in assets:
        spec.get("text_encoder", {}).pop(key, None)
    return spec


def model_fingerprint(model: MatchingModel) -> str:
    """sha256 (hex) of a model's embedding spec and encoder weights.

    Floating-point weights are hashed as float32, so the same weights stored in float16 and
    loaded into a float32 or float16 model give the same fingerprint; the device does not count.

    Example:
        >>> a = xmatch.build("teran-mrsw-scenes", pretrained=True)
        >>> b = xmatch.build("teran-mrsw-scenes", pretrained=True, pooler={"name": "Symm"})
        >>> model_fingerprint(a) == model_fingerprint(b)
        True
    """
    digest = hashlib.sha256(json.dumps(embedding_spec(model), sort_keys=True, default=str).encode())
    for name, tensor in sorted(model.state_dict().items()):
        if name.split(".", 1)[0] in SCORING_PARTS:
            continue
        t = tensor.detach().to("cpu")
        t = t.float() if t.is_floating_point() else t
        digest.update(f"{name}:{tuple(t.shape)}:{t.dtype};".encode())
        digest.update(t.contiguous().numpy().tobytes() if t.numel() else b"")
    return digest.hexdigest()


def short(fingerprint: str) -> str:
    """The first 12 hex digits, for messages."""
    return fingerprint[:12]


__all__ = ["SCORING_PARTS", "embedding_spec", "model_fingerprint", "short"]
