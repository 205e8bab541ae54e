"""SCAN's region encoder for precomputed bottom-up features.

Lee, Chen, Hua, Hu, He. "Stacked Cross Attention for Image-Text Matching", ECCV 2018:
``v_i = W f_i + b``, then L2-normalised (the code's ``EncoderImagePrecomp``); no boxes or
positions are used.

In an xmatch model the encoder's output goes through the model's image projection
(``Linear(output_dim, embed_dim)``, kept on: ``image_projection = true``), the image reasoner
and a final L2 normalisation. This encoder therefore hands the raw region features on
unchanged (``output_dim = feature_dim``): with the ``identity`` reasoner the model computes
exactly SCAN's ``l2norm(W f + b)``, the projection being SCAN's ``fc`` (``Linear(2048, 1024)``;
:func:`xmatch_scan.init_like_original` gives it the original Xavier initialisation).
"""

from __future__ import annotations

from xmatch.plugin import RegionFeaturesImageEncoder


class ScanPrecompImageEncoder(RegionFeaturesImageEncoder):
    """Precomputed region features, as SCAN reads them: features only, boxes ignored.

    Takes the same inputs as xmatch's ``bottomup`` encoder (regions, boxes, mask; boxes may be
    left out); padded regions are zeroed and masked out. Every real region takes part in the
    attention.

    Args:
        feature_dim: width of the region features (2048 for bottom-up Faster R-CNN).

    Example:
        >>> import torch
        >>> enc = ScanPrecompImageEncoder(feature_dim=8)
        >>> out = enc(torch.rand(2, 3, 8), mask=torch.tensor([[True, True, False], [True] * 3]))
        >>> out.tokens.shape, out.tokens[0, 2].abs().sum().item(), out.content.sum().item()
        (torch.Size([2, 3, 8]), 0.0, 5)
    """
