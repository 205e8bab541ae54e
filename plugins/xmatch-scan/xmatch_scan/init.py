"""The original SCAN initialisation for an xmatch model built from a SCAN spec.

Lee, Chen, Hua, Hu, He. "Stacked Cross Attention for Image-Text Matching", ECCV 2018
(kuanghuei/SCAN ``model.py:EncoderImagePrecomp.init_weights``).

``xmatch.build`` creates the model's two projections with PyTorch's default ``nn.Linear``
initialisation, and a plugin component cannot reach them. This function sets them as the
original would have them.
"""

from __future__ import annotations

import torch
from torch import nn
from xmatch import MatchingModel

from xmatch_scan.image import ScanPrecompEncoder
from xmatch_scan.text import ScanBiGRUTextEncoder


@torch.no_grad()
def init_like_original(model: MatchingModel) -> MatchingModel:
    """Initialise a SCAN model's projections as the original code does, in place.

    - The image projection is SCAN's ``fc``: Xavier-uniform weights, U(-r, r) with
      r = sqrt(6 / (in + out)), and a zero bias.
    - The text projection has no counterpart in SCAN (its words go straight from the GRU to
      the L2 norm); it becomes the identity, so the model computes SCAN's function exactly
      until training moves it.

    The word embeddings (U(-0.1, 0.1)) and the GRU (PyTorch defaults) already start as in the
    original.

    Args:
        model: a model with a ``scan-precomp`` image encoder and a ``scan-bigru`` text encoder
            whose ``hidden_dim`` equals the model's ``embed_dim``.

    Returns:
        The same model.

    Example:
        >>> model = init_like_original(xmatch.build("scan-t2i-avg-f30k", text_encoder={"vocab": words}))  # doctest: +SKIP
    """
    if not isinstance(model.image_encoder, ScanPrecompEncoder) or not isinstance(model.text_encoder, ScanBiGRUTextEncoder):
        raise TypeError(
            "init_like_original initialises SCAN models: image encoder 'scan-precomp' and text encoder "
            f"'scan-bigru'; this model has {type(model.image_encoder).__name__} and {type(model.text_encoder).__name__}."
        )
    text = model.text_projection
    if text.in_features != text.out_features:
        raise ValueError(
            f"the text projection maps {text.in_features} to {text.out_features} features; it can only start "
            f"as the identity when the text encoder's hidden_dim equals embed_dim ({text.out_features})."
        )
    nn.init.xavier_uniform_(model.image_projection.weight)
    model.image_projection.bias.zero_()
    text.weight.copy_(torch.eye(text.in_features, dtype=text.weight.dtype, device=text.weight.device))
    text.bias.zero_()
    return model
