"""The original SCAN initialisation for an xmatch model built from a SCAN spec.

Lee, Chen, Hua, Hu, He. "Stacked Cross Attention for Image-Text Matching", ECCV 2018
(kuanghuei/SCAN ``model.py:EncoderImagePrecomp.init_weights``).

``xmatch.build`` creates the model's image projection (SCAN's ``fc``) with PyTorch's default
``nn.Linear`` initialisation, and a plugin component cannot reach it. This function gives it
the original's.
"""

from __future__ import annotations

import torch
from torch import nn
from xmatch import MatchingModel

from xmatch_scan.image import ScanPrecompEncoder
from xmatch_scan.text import ScanBiGRUTextEncoder


@torch.no_grad()
def init_like_original(model: MatchingModel) -> MatchingModel:
    """Initialise a SCAN model's ``fc`` (the image projection) as the original code does, in place:
    Xavier-uniform weights, U(-r, r) with r = sqrt(6 / (in + out)), and a zero bias.

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
    if not isinstance(model.image_encoder, ScanPrecompEncoder) or not isinstance(model.text_encoder, ScanBiGRUTextEncoder):
        raise TypeError(
            "init_like_original initialises SCAN models: image encoder 'scan-precomp' and text encoder "
            f"'scan-bigru'; this model has {type(model.image_encoder).__name__} and {type(model.text_encoder).__name__}."
        )
    if not isinstance(model.image_projection, nn.Linear):
        raise ValueError(
            "this model has no image projection (image_projection = false), so it has no SCAN fc to "
            "initialise; build it with image_projection = true, as the scan-* zoo entries are."
        )
    if not isinstance(model.text_projection, nn.Identity):
        raise ValueError(
            "this model has a text projection, a layer SCAN does not have (its Bi-GRU states go straight "
            "to the L2 norm); build it with text_projection = false, as the scan-* zoo entries are."
        )
    nn.init.xavier_uniform_(model.image_projection.weight)
    model.image_projection.bias.zero_()
    return model
