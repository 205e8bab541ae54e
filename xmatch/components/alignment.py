"""The region x word cosine matrix all alignment poolers share.

TERAN's poolers (MrSw, MwSr, Symm, MrAvgw), SCAN's attention and Sum-Max scores, OAN's set-wise
cosine and any plugin pooler of the same family start from the cosine of every region of every
image with every word of every text. :func:`pairwise_cosines` computes it once for all of them,
as one large matmul; :class:`AlignmentPooler` is the base of the poolers that pool it with
maxima.
"""

from __future__ import annotations

import torch

from xmatch.model.embeddings import Embeddings
from xmatch.model.interfaces import Pooler

#: a CPU matmul's output columns are padded to a multiple of this: on an AVX-512 CPU,
#: [2304 x 1024] @ [1024 x N] ran at 117-130 GFLOP/s for odd N and at 184-194 for N % 16 == 0
#: (2 threads, 2026-11-26). The padding moves a value by the last bit at most: on one thread
#: (MKL 2024.2), float32 products of 12 columns or more and 4 rows or more, and bfloat16
#: products of any width, equal the unpadded ones bit for bit; narrower float32 products and
#: float64 ones take other BLAS kernels when unpadded and can differ in the last bit.
OUTPUT_COLUMNS_MULTIPLE = 16


def pairwise_cosines(image_tokens: torch.Tensor, text_tokens: torch.Tensor) -> torch.Tensor:
    """Cosine of every region of every image with every word of every text.

    One ``[n_img * R, D] @ [D, n_txt * W]`` matmul (an einsum or a batched product runs BLAS
    well below its rate). On a CPU the product's columns are padded with zero rows up to a
    multiple of :data:`OUTPUT_COLUMNS_MULTIPLE`, where BLAS runs at its full rate, and the
    padding is sliced off again: the result is a view with a wider row stride.

    Args:
        image_tokens: ``[n_img, R, D]`` region vectors, L2-normalised along ``D`` so that the
            dot product is the cosine (the token outputs of every xmatch model are).
        text_tokens: ``[n_txt, W, D]`` word vectors, L2-normalised likewise.

    Returns:
        ``[n_img, R, n_txt, W]`` with ``[i, r, t, w] = image_tokens[i, r] . text_tokens[t, w]``.
        No mask is applied: a padded slot gives the dot product with whatever vector it holds.
        Zero the padded slots beforehand for cells of 0 (harmless in sums), or fill them with
        a real token of the same item for cells that never change a max
        (:meth:`AlignmentPooler.alignment`); mask the cells themselves before a softmax.

    Example:
        >>> regions = torch.eye(3)[None, :2]          # one image, regions e1 and e2
        >>> words = torch.tensor([[[0.6, 0.8, 0.0]]])  # one text, one word
        >>> pairwise_cosines(regions, words).flatten()
        tensor([0.6000, 0.8000])
    """
    if image_tokens.ndim != 3 or text_tokens.ndim != 3 or image_tokens.shape[-1] != text_tokens.shape[-1]:
        raise ValueError(
            "pairwise_cosines takes image tokens [n_img, R, D] and text tokens [n_txt, W, D] of the same width D; "
            f"got {tuple(image_tokens.shape)} and {tuple(text_tokens.shape)}."
        )
    n_img, regions, dim = image_tokens.shape
    n_txt, words_per_text, _ = text_tokens.shape
    words = text_tokens.reshape(-1, dim)
    n = words.shape[0]
    extra = -n % OUTPUT_COLUMNS_MULTIPLE if words.device.type == "cpu" else 0
    if extra:
        # zero rows make whole-width products; slicing them off leaves a view that splits
        # into [i, r, t, w] like the unpadded product
        words = torch.cat([words, words.new_zeros(extra, dim)])
    return (image_tokens.reshape(-1, dim) @ words.T)[:, :n].view(n_img, regions, n_txt, words_per_text)


def pad_with_a_real_token(e: Embeddings) -> torch.Tensor:
    """``e.tokens`` with every padded slot replaced by the item's first real token.

    A padded cell of the cosine matrix then repeats a real cell of the same pair, so it never
    changes a max, and the large matrix needs no masking pass. An item without real tokens
    keeps slot 0's vector everywhere (its maxima are masked by the caller).

    Example:
        >>> e = Embeddings(torch.tensor([[[1.0, 0.0], [0.0, 9.0]]]), torch.tensor([[True, False]]))
        >>> pad_with_a_real_token(e)
        tensor([[[1., 0.],
                 [1., 0.]]])
    """
    if e.tokens.device.type == "cpu" and bool(e.mask.all()):
        # nothing to fill (image regions usually): no copy. On a GPU the check would be a
        # wait for the device, dearer than the copy.
        return e.tokens
    first_real = e.mask.to(torch.uint8).argmax(dim=1)
    first = e.tokens[torch.arange(len(e), device=e.tokens.device), first_real]
    return torch.where(e.mask[..., None], e.tokens, first[:, None])


class AlignmentPooler(Pooler):
    """Base of the poolers that score a pair with maxima of its region x word cosine matrix.

    A subclass implements :meth:`~xmatch.plugin.Pooler.pairwise` on one block from
    :meth:`alignment` and the best-match reductions :meth:`region_max` and :meth:`word_max`,
    which apply the masks: padded regions and words never win, and an item without real
    tokens has no best match (``-inf``). Blocks, their sizes and ``context`` come from
    :class:`~xmatch.plugin.Pooler`. TERAN's poolers (``MrSw``, ``MwSr``, ``Symm``, ``MrAvgw``)
    derive from it.

    Example:
        A pooler that averages over the words their best region (MrSw per word):

        >>> class MeanMaxPooler(AlignmentPooler):
        ...     def pairwise(self, img, txt):
        ...         best = self.region_max(self.alignment(img, txt), img)  # [i, t, w]
        ...         return best.masked_fill(~txt.mask[None], 0).sum(dim=2) / txt.lengths[None]
        >>> regions = Embeddings(torch.eye(2)[None], torch.ones(1, 2, dtype=torch.bool))
        >>> words = Embeddings(torch.tensor([[[0.6, 0.8], [1.0, 0.0]]]), torch.ones(1, 2, dtype=torch.bool))
        >>> MeanMaxPooler()(regions, words)  # (0.8 + 1.0) / 2
        tensor([[0.9000]])
    """

    @staticmethod
    def alignment(img: Embeddings, txt: Embeddings) -> torch.Tensor:
        """``[i, r, t, w]`` region x word cosines (:func:`pairwise_cosines`) whose padded cells
        repeat a real cell of the same pair (:func:`pad_with_a_real_token`): they never win a
        max, but they do count in a sum or a softmax unless masked."""
        return pairwise_cosines(pad_with_a_real_token(img), pad_with_a_real_token(txt))

    @staticmethod
    def paired_alignment(img: Embeddings, txt: Embeddings) -> torch.Tensor:
        """``[k, r, w]`` region x word cosines of the row-aligned pairs ``(img[k], txt[k])``,
        padded cells as in :meth:`alignment` (what :meth:`~xmatch.plugin.Pooler.paired` pools)."""
        return torch.bmm(pad_with_a_real_token(img), pad_with_a_real_token(txt).transpose(1, 2))

    @staticmethod
    def _no_candidates(best: torch.Tensor, empty: torch.Tensor) -> torch.Tensor:
        # an item without any real token has no candidate for the max, as with -inf masking
        return best.masked_fill(empty, float("-inf")) if bool(empty.any()) else best

    @classmethod
    def region_max(cls, a: torch.Tensor, img: Embeddings) -> torch.Tensor:
        """Per image, text and word, the best real region ``[i, t, w]`` of ``a =``
        :meth:`alignment`; ``-inf`` for an image without real regions."""
        return cls._no_candidates(a.amax(dim=1), ~img.mask.any(dim=1)[:, None, None])

    @classmethod
    def word_max(cls, a: torch.Tensor, txt: Embeddings) -> torch.Tensor:
        """Per image, text and region, the best real word ``[i, t, r]`` of ``a =``
        :meth:`alignment`; ``-inf`` for a text without real words."""
        return cls._no_candidates(a.amax(dim=3).transpose(1, 2), ~txt.mask.any(dim=1)[None, :, None])
