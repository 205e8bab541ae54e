"""xmatch: fine-grained image-text matching and cross-modal retrieval (TERN, TERAN and friends).

Example:
    >>> import xmatch
    >>> xmatch.list_models("tern-*")
    ['tern-align-coco', 'tern-coco', 'tern-scenes']
"""

from __future__ import annotations

from xmatch.core.builtins import register_builtins
from xmatch.core.lazy import lazy_names
from xmatch.core.version import __version__ as __version__
from xmatch.core.zoo import ZooEntry, info, list_models, zoo_entries_from_toml
from xmatch.core.errors import XmatchError
from xmatch.core.registry import (
    register_dataset,
    register_image_encoder,
    register_loss,
    register_model,
    register_negative,
    register_pooler,
    register_proposer,
    register_reasoner,
    register_text_encoder,
    register_verifier,
)
from xmatch.core.spec import SpecError

#: the public names that need torch, imported on first use (PEP 562): ``import xmatch`` and the
#: command line's argument parsing stay free of torch and the model stack
_LAZY = {
    "save_pretrained": "xmatch.io.bundle",
    "build": "xmatch.model.factory",
    "convert_original": "xmatch.model.factory",
    "model_from_spec": "xmatch.model.factory",
    **dict.fromkeys(("EncoderOutput", "ImageEncoder", "Loss", "LossOutput", "Pooler", "Reasoner", "TextEncoder",
                     "TokenBatch"), "xmatch.model.interfaces"),
    **dict.fromkeys(("normalize_boxes", "ImageBatch", "PairBatch", "PixelInputs", "RegionInputs"), "xmatch.model.inputs"),
    "Embeddings": "xmatch.model.embeddings",
    "MatchingModel": "xmatch.model.model",
}


__getattr__, __dir__ = lazy_names(__name__, _LAZY, subpackages=True)

register_builtins()


def list_components(kind: str) -> list[str]:
    """Registered names of one component kind (``image_encoders``, ``text_encoders``,
    ``reasoners``, ``poolers``, ``losses``, ``models``, ``datasets``, ``proposers``, ``negatives``, ``verifiers``).

    Example:
        >>> xmatch.list_components("poolers")  # and those of the installed plugins
        ['global-cosine', 'MrAvgw', 'MrSw', 'MwSr', ...'Symm'...]
    """
    from xmatch.core.registry import get_registry

    return get_registry(kind).names()


__all__ = [
    "Embeddings", "EncoderOutput", "ImageBatch", "ImageEncoder", "Loss", "LossOutput", "MatchingModel", "PairBatch",
    "PixelInputs", "Pooler", "Reasoner", "RegionInputs", "SpecError", "TextEncoder", "TokenBatch", "XmatchError", "ZooEntry", "build", "convert_original",
    "info", "list_components", "list_models", "model_from_spec", "normalize_boxes",
    "register_dataset", "register_image_encoder", "register_loss", "register_model",
    "register_negative", "register_pooler", "register_proposer", "register_reasoner", "register_text_encoder", "register_verifier", "save_pretrained",
    "zoo_entries_from_toml",
]
