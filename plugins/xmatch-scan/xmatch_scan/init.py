"""The original SCAN initialisation for an xmatch model built from a SCAN spec.

Lee, Chen, Hua, Hu, He. "Stacked Cross Attention for Image-Text Matching", ECCV 2018
(kuanghuei/SCAN ``model.py:EncoderImagePrecomp.init_weights``).
"""

from __future__ import annotations

from xmatch.plugin import MatchingModel, init_projection_like_original

from xmatch_scan.image import ScanPrecompImageEncoder
from xmatch_scan.text import ScanBiGRUTextEncoder


def init_like_original(model: MatchingModel) -> MatchingModel:
    """Initialise a SCAN model's ``fc`` (the image projection) as the original code does, in place:
    Xavier-uniform weights and a zero bias (:func:`xmatch.plugin.init_projection_like_original`).

    The word embeddings (U(-0.1, 0.1)) and the GRU (PyTorch defaults) already start as in the
    original, and the text side has no layer to initialise (``text_projection = false``: the
    Bi-GRU's averaged states go straight to the L2 norm), so afterwards every parameter starts
    as in the original.

    Args:
        model: a model with a ``scan-precomp`` image encoder followed by a linear image projection
            and a ``scan-bigru`` text encoder with no text projection (the zoo entries' layout).

    Returns:
        The same model.

    Example:
        >>> words = ["a", "dog", "on", "the", "bench"]
        >>> model = init_like_original(xmatch.build("scan-t2i-avg-f30k", text_encoder={"vocab": words}))
        >>> model.image_projection.bias.abs().sum().item()  # Xavier weights, zero bias
        0.0
    """
    return init_projection_like_original(
        model, "SCAN", {"scan-precomp": ScanPrecompImageEncoder}, {"scan-bigru": ScanBiGRUTextEncoder}
    )
