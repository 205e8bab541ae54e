"""The original VSE++ initialisation for an xmatch model built from a VSE++ spec.

Faghri, Fleet, Kiros, Fidler. "VSE++: Improving Visual-Semantic Embeddings with Hard
Negatives", BMVC 2018 (fartashf/vsepp ``model.py:EncoderImageFull.init_weights``,
``EncoderImagePrecomp.init_weights``).

``xmatch.build`` creates the model's image projection (VSE++'s ``fc``) with PyTorch's default
``nn.Linear`` initialisation, and a plugin component cannot reach it. This function gives it
the original's.
"""

from __future__ import annotations

import torch
from torch import nn

from xmatch import MatchingModel
from xmatch_vsepp.image import VSEPPImageEncoder, VSEPPPrecompEncoder
from xmatch_vsepp.text import VSEPPTextEncoder


@torch.no_grad()
def init_like_original(model: MatchingModel) -> MatchingModel:
    """Initialise a VSE++ model's ``fc`` (the image projection) as the original code does, in
    place: Xavier-uniform weights, U(-r, r) with r = sqrt(6 / (in + out)), and a zero bias.

    The word embeddings (U(-0.1, 0.1)), the GRU (PyTorch defaults) and the CNN (random or the
    ImageNet weights asked for) already start as in the original, and the caption side has no
    layer to initialise (``text_projection = false``), so afterwards every parameter starts as
    in the original.

    Args:
        model: a model with a ``vsepp-cnn`` or ``vsepp-precomp`` image encoder followed by a
            linear image projection, and a ``vsepp-gru`` text encoder with no text projection
            (the zoo entries' layout).

    Returns:
        The same model.

    Example:
        >>> words = ["a", "dog", "on", "the", "bench"]
        >>> model = init_like_original(xmatch.build("vsepp-precomp-coco", text_encoder={"vocab": words}))
        >>> model.image_projection.bias.abs().sum().item()  # Xavier weights, zero bias
        0.0
    """
    if not isinstance(model.image_encoder, (VSEPPImageEncoder, VSEPPPrecompEncoder)) or not isinstance(
        model.text_encoder, VSEPPTextEncoder
    ):
        raise TypeError(
            "init_like_original initialises VSE++ models: image encoder 'vsepp-cnn' or 'vsepp-precomp' and text "
            f"encoder 'vsepp-gru'; this model has {type(model.image_encoder).__name__} and "
            f"{type(model.text_encoder).__name__}."
        )
    if not isinstance(model.image_projection, nn.Linear):
        raise ValueError(
            "this model has no image projection (image_projection = false), so it has no VSE++ fc to "
            "initialise; build it with image_projection = true, as the vsepp-* zoo entries are."
        )
    if not isinstance(model.text_projection, nn.Identity):
        raise ValueError(
            "this model has a text projection, a layer VSE++ does not have (its GRU state goes straight to "
            "the l2norm); build it with text_projection = false, as the vsepp-* zoo entries are."
        )
    nn.init.xavier_uniform_(model.image_projection.weight)
    model.image_projection.bias.zero_()
    return model
