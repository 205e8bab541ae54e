"""OAN's inter-modal attention and set-wise cosine similarity (Huang et al., ICMR 2019).

For a query set ``A`` and a context set ``B`` of unit vectors (``s_pq = [a_p . b_q]_+``):
``s_pq / sqrt(sum_p' s_p'q^2)`` (normalised over the queries of each context element),
``alpha_pq = softmax_q(lambda .)`` over the real context elements, ``att_p = sum_q alpha_pq b_q``,
``R(A -> B) = (1/|A|) sum_p cos(a_p, att_p)``; the set-wise cosine similarity is
``(R(A -> B; lambda_ab) + R(B -> A; lambda_ba)) / 2``.

``cos(a_p, att_p)`` is computed without materialising ``att_p``: ``a_p . att_p =
sum_q alpha_pq (a_p . b_q)`` and ``|att_p|^2 = alpha_p^T G_B alpha_p`` with ``G_B`` the Gram
matrix of ``B``, so a block of pairs costs what its cosine matrix
(:func:`xmatch.plugin.pairwise_cosines`) costs.
"""

from __future__ import annotations

import torch

from xmatch.plugin import pairwise_cosines


def _relevance(
    c: torch.Tensor,
    q_mask: torch.Tensor,
    k_mask: torch.Tensor,
    gram: torch.Tensor,
    lam: float,
    eps: float,
) -> torch.Tensor:
    """Mean over real queries of ``cos(query, attended context)``.

    Args:
        c: ``[na, nb, Q, K]`` cosines of query x context elements (zero where padded).
        q_mask: ``[na|1, nb|1, Q]`` real queries; k_mask: ``[na|1, nb|1, K]`` real context.
        gram: ``[na|1, nb|1, K, K]`` context Gram matrices.
    """
    s = c.clamp_min(0)
    s = s / (s.square().sum(dim=2, keepdim=True).sqrt() + eps)
    logits = (lam * s).masked_fill(~k_mask.unsqueeze(-2), float("-inf"))
    alpha = logits.softmax(dim=-1)
    dot = (alpha * c).sum(dim=-1)
    norm = ((alpha @ gram) * alpha).sum(dim=-1).clamp_min(0).sqrt()
    relevance = (dot / norm.clamp_min(eps)).masked_fill(~q_mask, 0)
    return relevance.sum(dim=-1) / q_mask.sum(dim=-1).to(relevance.dtype)


def setwise_cosine(
    a: torch.Tensor,
    a_mask: torch.Tensor,
    b: torch.Tensor,
    b_mask: torch.Tensor,
    lambda_ab: float,
    lambda_ba: float,
    eps: float = 1e-8,
) -> torch.Tensor:
    """Set-wise cosine similarity of every set of ``a`` with every set of ``b``: ``[na, nb]``.

    Args:
        a: ``[na, P, D]`` unit vectors (queries of the ``a -> b`` attention); a_mask ``[na, P]``.
        b: ``[nb, Q, D]`` unit vectors; b_mask ``[nb, Q]``.
        lambda_ab: inverse temperature when ``a``'s elements attend to ``b``'s.
        lambda_ba: inverse temperature when ``b``'s elements attend to ``a``'s.

    Example:
        >>> one = torch.ones(1, 1, dtype=torch.bool)
        >>> setwise_cosine(torch.tensor([[[1.0, 0.0]]]), one, torch.tensor([[[0.6, 0.8]]]), one, 0.5, 0.9)
        tensor([[0.6000]])
    """
    a = a.masked_fill(~a_mask.unsqueeze(-1), 0)
    b = b.masked_fill(~b_mask.unsqueeze(-1), 0)
    c = pairwise_cosines(a, b).transpose(1, 2)  # [na, nb, P, Q], 0 at padded slots
    a_to_b = _relevance(c, a_mask[:, None], b_mask[None], (b @ b.transpose(1, 2))[None], lambda_ab, eps)
    b_to_a = _relevance(
        c.transpose(2, 3), b_mask[None], a_mask[:, None], (a @ a.transpose(1, 2))[:, None], lambda_ba, eps
    )
    return (a_to_b + b_to_a) / 2
