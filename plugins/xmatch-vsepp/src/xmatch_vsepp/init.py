"""The original VSE++ initialisation for an xmatch model built from a VSE++ spec.

Faghri, Fleet, Kiros, Fidler. "VSE++: Improving Visual-Semantic Embeddings with Hard
Negatives", BMVC 2018 (fartashf/vsepp ``model.py:EncoderImageFull.init_weights``,
``EncoderImagePrecomp.init_weights``).
"""

from __future__ import annotations

from xmatch.plugin import MatchingModel, init_projection_like_original

from xmatch_vsepp.image import VSEPPImageEncoder, VSEPPPrecompImageEncoder
from xmatch_vsepp.text import VSEPPTextEncoder


def init_like_original(model: MatchingModel) -> MatchingModel:
    """Initialise a VSE++ model's ``fc`` (the image projection) as the original code does, in
    place: Xavier-uniform weights and a zero bias (:func:`xmatch.plugin.init_projection_like_original`).

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
    return init_projection_like_original(
        model, "VSE++", {"vsepp-cnn": VSEPPImageEncoder, "vsepp-precomp": VSEPPPrecompImageEncoder},
        {"vsepp-gru": VSEPPTextEncoder},
    )
