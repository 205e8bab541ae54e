"""xmatch: fine-grained image-text matching and cross-modal retrieval (TERN, TERAN and friends).

Example:
    >>> import xmatch
    >>> xmatch.list_models("tern-*")
    ['tern-align-coco', 'tern-coco', 'tern-scenes']
"""

from __future__ import annotations

from xmatch.core.builtins import register_builtins
from xmatch.io.bundle import save_pretrained
from xmatch.model.factory import build, convert_original, model_from_spec
from xmatch.core.version import __version__ as __version__
from xmatch.core.zoo import ZooEntry, info, list_models, zoo_entries_from_toml
from xmatch.model.interfaces import (
    EncoderOutput,
    ImageEncoder,
    Loss,
    LossOutput,
    Pooler,
    Reasoner,
    TextEncoder,
    TokenBatch,
)
from xmatch.model.inputs import normalize_boxes
from xmatch.model.embeddings import Embeddings
from xmatch.core.errors import XmatchError
from xmatch.model.inputs import ImageBatch, PairBatch, PixelInputs, RegionInputs
from xmatch.model.model import MatchingModel
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
