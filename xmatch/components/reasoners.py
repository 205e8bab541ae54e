"""Reasoning stacks that contextualise a set: the papers' transformer encoder, and identity.

TERN/TERAN (Messina et al., ICPR 2020 / ACM TOMM 2021) use post-norm transformer encoder
layers with ReLU, 4 heads, feed-forward width 2048 and dropout 0.1.
"""

from __future__ import annotations

import torch
from torch import nn

from xmatch.model.interfaces import Reasoner


class TransformerReasoner(Reasoner):
    """A stack of post-norm transformer encoder layers over a padded set.

    Each layer is ``x = LN1(x + Drop(SA(x)))``, ``x = LN2(x + Drop(W2 Drop(ReLU(W1 x))))``
    (``torch.nn.TransformerEncoderLayer``, LN eps 1e-5); padded positions are excluded from
    attention through the key padding mask; there is no final LayerNorm.

    Args:
        dim: model width (set by the model builder: the joint embedding size).
        layers: number of layers.
        heads: attention heads (``dim`` must be divisible by it).
        ff_dim: feed-forward width (2048 in the papers, whatever ``dim`` is).
        dropout: dropout on attention weights and both residual branches.
        norm_first: pre-norm layers instead of the papers' post-norm.

    Example:
        >>> r = TransformerReasoner(dim=32, layers=2, heads=4)
        >>> r(torch.randn(2, 5, 32), torch.ones(2, 5, dtype=torch.bool)).shape
        torch.Size([2, 5, 32])
    """

    def __init__(
        self,
        dim: int,
        layers: int = 2,
        heads: int = 4,
        ff_dim: int = 2048,
        dropout: float = 0.1,
        norm_first: bool = False,
    ) -> None:
        super().__init__()
        if dim % heads:
            raise ValueError(f"transformer reasoner: dim {dim} is not divisible by heads {heads}.")
        if layers < 0:
            raise ValueError(f"transformer reasoner: layers must be >= 0, got {layers}.")
        self.dim = dim
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(
                d_model=dim,
                nhead=heads,
                dim_feedforward=ff_dim,
                dropout=dropout,
                activation="relu",
                batch_first=True,
                norm_first=norm_first,
            )
            for _ in range(layers)
        )

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        padding = ~mask
        for layer in self.layers:
            x = layer(x, src_key_padding_mask=padding)
        return x


class IdentityReasoner(Reasoner):
    """No reasoning: the projected set is returned unchanged.

    Example:
        >>> IdentityReasoner(dim=8)(torch.ones(1, 2, 8), torch.ones(1, 2, dtype=torch.bool)).sum()
        tensor(16.)
    """

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return x
