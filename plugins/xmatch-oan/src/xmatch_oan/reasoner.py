"""OAN's intra-modal context attention, T-T and V-V (Huang et al., ICMR 2019).

Single hop, ``K`` heads (6), inverse temperature ``lambda`` (1.0). Every head scores the
elements of one set against each other with its own query and key maps at the full width
``D`` (512 is not divisible by 6, so the heads do not split the width); the context of an
element is the attention-weighted sum of the set's elements, averaged over the heads, and it
is added to the element:

``alpha^k_pq = softmax_q(lambda (Q_k x_p) . (K_k x_q) / sqrt(D))`` over real ``q``,
``x'_p = x_p + (1/K) sum_k sum_q alpha^k_pq x_q``.

OAN's encoders end with ``tanh(W x + b)``: xmatch's projection is ``W x + b``, so with
``input_tanh`` the reasoner applies that tanh first.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from xmatch.plugin import Reasoner


class OANContextReasoner(Reasoner):
    """tanh, then one hop of multi-head intra-modal context attention with a residual.

    Args:
        dim: element width (set by the model: ``embed_dim``).
        heads: attention heads ``K`` (6).
        lambda_softmax: inverse temperature of the attention (1.0).
        input_tanh: apply OAN's perceptron tanh to the input first.

    Example:
        >>> r = OANContextReasoner(dim=8, heads=2)
        >>> r(torch.randn(2, 3, 8), torch.ones(2, 3, dtype=torch.bool)).shape
        torch.Size([2, 3, 8])
    """

    def __init__(self, dim: int, heads: int = 6, lambda_softmax: float = 1.0, input_tanh: bool = True) -> None:
        super().__init__()
        if heads < 1:
            raise ValueError(f"reasoner 'oan-context': heads must be at least 1, got {heads}.")
        self.dim = dim
        self.heads = heads
        self.lambda_softmax = lambda_softmax
        self.input_tanh = input_tanh
        self.query = nn.Linear(dim, heads * dim, bias=False)
        self.key = nn.Linear(dim, heads * dim, bias=False)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        if x.dim() != 3 or mask.shape != x.shape[:2]:
            raise ValueError(f"reasoner 'oan-context' takes x [B, N, D] and mask [B, N], got {tuple(x.shape)} and {tuple(mask.shape)}.")
        if self.input_tanh:
            x = torch.tanh(x)
        b, n, d = x.shape
        q = self.query(x).view(b, n, self.heads, d)
        k = self.key(x).view(b, n, self.heads, d)
        logits = torch.einsum("bpkd,bqkd->bkpq", q, k) * (self.lambda_softmax / math.sqrt(d))
        alpha = logits.masked_fill(~mask[:, None, None, :], float("-inf")).softmax(dim=-1)
        context = torch.einsum("bkpq,bqd->bpd", alpha, x) / self.heads
        return x + context
