"""The original VSE-family initialisation of a model's image projection (SCAN, VSE++).

SCAN (Lee et al., ECCV 2018) and VSE++ (Faghri et al., BMVC 2018) map image features to the
joint space with one ``fc`` layer whose ``init_weights`` is Xavier-uniform with a zero bias;
their caption side has no layer after the RNN. In an xmatch model that ``fc`` is the model's
image projection, which ``xmatch.build`` creates with PyTorch's default ``nn.Linear``
initialisation and which a plugin component cannot reach: :func:`init_projection_like_original`
gives it the original's, after checking that the model has the family's layout.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import torch
from torch import nn

if TYPE_CHECKING:
    from xmatch.model.model import MatchingModel


@torch.no_grad()
def init_projection_like_original(
    model: MatchingModel,
    family: str,
    image_encoders: Mapping[str, type[nn.Module]],
    text_encoders: Mapping[str, type[nn.Module]],
) -> MatchingModel:
    """Initialise ``model``'s image projection in place as the original ``fc``: Xavier-uniform
    weights, U(-r, r) with r = sqrt(6 / (in + out)), and a zero bias.

    Args:
        model: a model with one of ``image_encoders``, a linear image projection, one of
            ``text_encoders`` and no text projection (the family's zoo layout).
        family: the paper's name, for the messages (``"SCAN"``, ``"VSE++"``).
        image_encoders, text_encoders: registered name -> class of the family's encoders.

    Returns:
        The same model.

    Raises:
        TypeError: the encoders are not the family's.
        ValueError: the model has no image projection, or has a text projection.

    Example:
        >>> from xmatch.components.image.bottomup import BottomUpImageEncoder
        >>> from xmatch.components.text.rnn import BiGRUTextEncoder
        >>> model = xmatch.build({  # a VSE++-shaped model: a linear fc after the regions, none after the GRU
        ...     "embed_dim": 8, "image_projection": True, "text_projection": False,
        ...     "image_encoder": {"name": "bottomup", "feature_dim": 16, "layers": 0},
        ...     "text_encoder": {"name": "bigru", "vocab": ["a", "dog"], "word_dim": 8, "hidden_dim": 4},
        ...     "image_reasoner": {"name": "identity"}, "text_reasoner": {"name": "identity"},
        ...     "pooler": {"name": "global-cosine"}, "loss": {"name": "hinge"}})
        >>> model = init_projection_like_original(
        ...     model, "VSE++", {"bottomup": BottomUpImageEncoder}, {"bigru": BiGRUTextEncoder})
        >>> model.image_projection.bias.abs().sum().item()  # Xavier weights, zero bias
        0.0
    """
    if not isinstance(model.image_encoder, tuple(image_encoders.values())) or not isinstance(
        model.text_encoder, tuple(text_encoders.values())
    ):
        images = " or ".join(f"'{n}'" for n in image_encoders)
        texts = " or ".join(f"'{n}'" for n in text_encoders)
        raise TypeError(
            f"init_like_original initialises {family} models: image encoder {images} and text encoder {texts}; "
            f"this model has {type(model.image_encoder).__name__} and {type(model.text_encoder).__name__}."
        )
    if not isinstance(model.image_projection, nn.Linear):
        raise ValueError(
            f"this model has no image projection (image_projection = false), so it has no {family} fc to "
            f"initialise; build it with image_projection = true, as the {family} zoo entries are."
        )
    if not isinstance(model.text_projection, nn.Identity):
        raise ValueError(
            f"this model has a text projection, a layer {family} does not have (its text encoder's output goes "
            f"straight to the L2 norm); build it with text_projection = false, as the {family} zoo entries are."
        )
    nn.init.xavier_uniform_(model.image_projection.weight)
    model.image_projection.bias.zero_()
    return model
