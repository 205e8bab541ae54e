"""MUVERA fixed dimensional encodings: one vector per token set whose inner product
approximates a sum of maxima (Dhulipala et al., "MUVERA: Multi-Vector Retrieval via Fixed
Dimensional Encodings", NeurIPS 2024).

Token vectors are bucketed by SimHash (``bits`` random hyperplanes, ``2**bits`` buckets),
projected to ``proj`` dimensions, and aggregated per bucket, ``reps`` times with independent
randomness. The side whose tokens are summed over in the score (the caption's words for MrSw)
is encoded with per-bucket *sums*; the side whose best token is taken is encoded with
per-bucket *means*, an empty bucket borrowing the token whose hash is nearest in Hamming
distance. Their inner product then estimates ``sum_q max_p <q, p>``.
"""

from __future__ import annotations

import torch

from xmatch.model.embeddings import Embeddings


class FixedEncoder:
    """Encodes token sets into MUVERA vectors of ``reps * 2**bits * proj`` dimensions.

    Args:
        dim: token width.
        reps: independent repetitions.
        bits: SimHash bits per repetition.
        proj: projected width per bucket (random +-1 / sqrt(proj) projection).
        seed: the random hyperplanes and projections.

    Example:
        >>> enc = FixedEncoder(8, reps=2, bits=2, proj=4)
        >>> e = Embeddings(torch.nn.functional.normalize(torch.randn(3, 5, 8), dim=-1), torch.ones(3, 5, dtype=torch.bool))
        >>> enc.encode(e, "sum").shape
        torch.Size([3, 32])
    """

    def __init__(self, dim: int, reps: int = 8, bits: int = 4, proj: int = 16, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.planes = torch.randn(reps, bits, dim, generator=g)
        self.proj = (torch.randint(0, 2, (reps, dim, proj), generator=g).float() * 2 - 1) / proj**0.5
        self.powers = 2 ** torch.arange(bits)
        self.reps, self.buckets, self.width = reps, 2**bits, proj

    @property
    def output_dim(self) -> int:
        return self.reps * self.buckets * self.width

    def encode(self, e: Embeddings, aggregate: str, chunk: int = 512) -> torch.Tensor:
        """``[N, output_dim]`` float32: ``aggregate="sum"`` for the summed-over side, ``"mean"``
        for the maximised-over side."""
        if aggregate not in ("sum", "mean"):
            raise ValueError(f"aggregate must be 'sum' or 'mean', got {aggregate!r}.")
        parts = [self._encode(e[i : i + chunk], aggregate) for i in range(0, len(e), chunk)]
        return torch.cat(parts) if parts else torch.zeros(0, self.output_dim)

    def _encode(self, e: Embeddings, aggregate: str) -> torch.Tensor:
        x = e.tokens.float()
        bits = torch.einsum("ntd,rbd->ntrb", x, self.planes) > 0
        bucket = (bits.long() * self.powers).sum(-1)  # [n, t, r]
        projected = torch.einsum("ntd,rdp->ntrp", x, self.proj)  # [n, t, r, p]
        member = torch.nn.functional.one_hot(bucket, self.buckets).float() * e.mask[:, :, None, None]
        sums = torch.einsum("ntrb,ntrp->nrbp", member, projected)
        if aggregate == "sum":
            return sums.flatten(1)
        counts = member.sum(1)  # [n, r, b]
        means = sums / counts.clamp_min(1)[..., None]
        # empty buckets take the projected token whose hash differs from the bucket's in fewest bits
        codes = torch.arange(self.buckets)
        hamming = _popcount(bucket[..., None] ^ codes)  # [n, t, r, b]
        hamming = hamming.masked_fill(~e.mask[:, :, None, None], 1 << 30)
        nearest = hamming.argmin(dim=1)  # [n, r, b]
        fill = _index_tokens(projected, nearest)
        empty = (counts == 0)[..., None]
        return torch.where(empty, fill, means).flatten(1)


def _index_tokens(projected: torch.Tensor, nearest: torch.Tensor) -> torch.Tensor:
    """``projected[n, nearest[n, r, b], r, :]`` -> ``[n, r, b, p]``."""
    n, _, r, p = projected.shape
    rows = torch.arange(n)[:, None, None]
    reps = torch.arange(r)[None, :, None]
    return projected[rows, nearest, reps]


def _popcount(x: torch.Tensor) -> torch.Tensor:
    count = torch.zeros_like(x)
    while bool((x > 0).any()):
        count += x & 1
        x = x >> 1
    return count
