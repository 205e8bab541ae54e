"""xmatch: fine-grained image-text matching and cross-modal retrieval (TERN, TERAN and friends).

Example:
    >>> import xmatch
    >>> xmatch.list_models("tern-*")
    ['tern-align-coco', 'tern-coco', 'tern-scenes']
"""

from __future__ import annotations

from xmatch._builtins import register_builtins
from xmatch._bundle import save_pretrained
from xmatch._factory import build, convert_original, model_from_spec
from xmatch._version import __version__ as __version__
from xmatch._zoo import ZooEntry, info, list_models, zoo_entries_from_toml
from xmatch.components.base import (
    EncoderOutput,
    ImageEncoder,
    Loss,
    LossOutput,
    Pooler,
    Reasoner,
    TextEncoder,
    TokenBatch,
)
from xmatch.components.image_bottomup import normalize_boxes
from xmatch.embeddings import Embeddings
from xmatch.errors import XmatchError
from xmatch.inputs import ImageBatch, PairBatch, PixelInputs, RegionInputs
from xmatch.model import MatchingModel
from xmatch.registry import (
    register_dataset,
    register_image_encoder,
    register_loss,
    register_model,
    register_pooler,
    register_proposer,
    register_reasoner,
    register_text_encoder,
)
from xmatch.spec import SpecError

register_builtins()


def list_components(kind: str) -> list[str]:
    """Registered names of one component kind (``image_encoders``, ``text_encoders``,
    ``reasoners``, ``poolers``, ``losses``, ``models``, ``datasets``, ``proposers``).

    Example:
        >>> xmatch.list_components("poolers")  # and those of the installed plugins
        ['global-cosine', 'MrAvgw', 'MrSw', 'MwSr', ...'Symm'...]
    """
    from xmatch.registry import get_registry

    return get_registry(kind).names()


__all__ = [
    "Embeddings", "EncoderOutput", "ImageBatch", "ImageEncoder", "Loss", "LossOutput", "MatchingModel", "PairBatch",
    "PixelInputs", "Pooler", "Reasoner", "RegionInputs", "SpecError", "TextEncoder", "TokenBatch", "XmatchError", "ZooEntry", "build", "convert_original",
    "info", "list_components", "list_models", "model_from_spec", "normalize_boxes",
    "register_dataset", "register_image_encoder", "register_loss", "register_model",
    "register_pooler", "register_proposer", "register_reasoner", "register_text_encoder", "save_pretrained",
    "zoo_entries_from_toml",
]
