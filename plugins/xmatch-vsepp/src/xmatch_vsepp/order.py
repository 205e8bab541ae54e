"""Order-embedding similarity of the VSE++ code (``--measure order``; Vendrov, Kiros, Fidler,
Urtasun, "Order-Embeddings of Images and Language", ICLR 2016), used by its Order0 / Order++
configurations (fartashf/vsepp ``model.py:order_sim``).

``S[i, j] = -|| max(0, s_j - im_i) ||_2`` on the global vectors. With ``use_abs`` both are
replaced by their absolute values first (``--use_abs``); the original takes ``|l2norm(x)|``,
and ``|l2norm(x)| = l2norm(|x|)``, so applying it to the model's unit vectors is the same.
"""

from __future__ import annotations

import math

import torch

from xmatch.plugin import Embeddings, Pooler


class OrderPooler(Pooler):
    """Negative order violation between image and caption global vectors.

    Args:
        use_abs: take absolute values of both vectors first (Order0).

    Example:
        >>> e = Embeddings(torch.zeros(2, 0, 2), torch.zeros(2, 0, dtype=torch.bool), torch.eye(2))
        >>> OrderPooler()(e, e) + 0.0  # + 0.0: a -0. on the diagonal prints as 0.
        tensor([[ 0., -1.],
                [-1.,  0.]])
    """

    uses_tokens = False

    def __init__(self, use_abs: bool = False) -> None:
        super().__init__()
        self.use_abs = use_abs

    def chunk_sizes(
        self, img: Embeddings, txt: Embeddings, image_chunk: int | None = None, text_chunk: int | None = None
    ) -> tuple[int, int]:
        # Every pair materialises a D-wide difference, so a block holds block_elements / D pairs.
        pairs = max(1, self.elements_per_block(img.tokens.device) // max(1, img.dim))
        if image_chunk is None and text_chunk is None:
            image_chunk = max(1, min(len(img), math.isqrt(pairs)))
        if image_chunk is None:
            image_chunk = max(1, min(len(img), pairs // text_chunk))
        if text_chunk is None:
            text_chunk = max(1, min(len(txt), pairs // image_chunk))
        return image_chunk, text_chunk

    def pairwise(self, img: Embeddings, txt: Embeddings) -> torch.Tensor:
        if img.pooled is None or txt.pooled is None:
            raise ValueError(
                "the vsepp-order pooler scores global vectors (Embeddings.pooled); use encoders with a "
                "global slot (vsepp-cnn, vsepp-precomp, vsepp-gru)."
            )
        im, s = img.pooled, txt.pooled
        if self.use_abs:
            im, s = im.abs(), s.abs()
        return -torch.linalg.vector_norm((s[None, :, :] - im[:, None, :]).clamp_min(0), dim=-1)
