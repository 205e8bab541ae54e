"""Poolers: from region and word embeddings to one image-sentence score.

TERAN (Messina et al., ACM TOMM 2021) pools the region x word cosine matrix ``A``:
``MrSw = sum_words max_regions A``, ``MwSr = sum_regions max_words A``,
``Symm = MrSw + MwSr`` and ``MrAvgw = MrSw / number of words``. TERN (ICPR 2020) scores the
cosine of the two CLS outputs (``global-cosine``).

Masked positions never win a max (they are ``-inf``). With ``compat="original"`` the pooler
reproduces the original code, which zero-fills masked cells *before* the max: every max over a
set that is narrower than the padded width also sees a 0 candidate. The original evaluation
pads images to 36 regions and captions to 85 alignment slots (its fixed widths 37 and 88 minus
the dropped slots); its training pads to the batch maximum (``batch_layout=True``).
"""

from __future__ import annotations

from typing import Any, Literal

import torch

from xmatch.model.interfaces import Pooler
from xmatch.model.embeddings import Embeddings

Compat = Literal["clean", "original"]


#: a CPU matmul's output columns are padded to a multiple of this: on an AVX-512 CPU,
#: [2304 x 1024] @ [1024 x N] ran at 117-130 GFLOP/s for odd N and at 184-194 for N % 16 == 0
#: (2 threads, 2026-11-26); the padded columns' scores equal the unpadded ones bit for bit
OUTPUT_COLUMNS_MULTIPLE = 16


def _flat_alignment(img_tokens: torch.Tensor, txt_tokens: torch.Tensor) -> torch.Tensor:
    # One large matmul instead of an einsum keeps BLAS at full speed: [i r, t w].
    d = img_tokens.shape[-1]
    words = txt_tokens.reshape(-1, d)
    n = words.shape[0]
    extra = -n % OUTPUT_COLUMNS_MULTIPLE if words.device.type == "cpu" else 0
    if extra:
        # zero rows make whole-width products; slicing them off leaves a view that splits
        # into [i, r, t, w] like the unpadded product
        words = torch.cat([words, words.new_zeros(extra, d)])
    return (img_tokens.reshape(-1, d) @ words.T)[:, :n]


def _pad_with_a_real_token(e: Embeddings) -> torch.Tensor:
    """Tokens where every padded slot repeats the item's first real token: the padding then
    never changes a max, so the large alignment matrix needs no masking pass."""
    if e.tokens.device.type == "cpu" and bool(e.mask.all()):
        # nothing to fill (image regions usually): no copy. On a GPU the check would be a
        # wait for the device, dearer than the copy.
        return e.tokens
    first_real = e.mask.to(torch.uint8).argmax(dim=1)
    first = e.tokens[torch.arange(len(e), device=e.tokens.device), first_real]
    return torch.where(e.mask[..., None], e.tokens, first[:, None])


class AlignmentPooler(Pooler):
    """Shared machinery of the TERAN poolers (see the module docstring).

    Args:
        compat: ``"clean"`` (masked cells excluded) or ``"original"`` (zero-fill before the
            max, as the original TERAN code).
        region_slots: padded region width of the original evaluation (36).
        word_slots: padded word width of the original evaluation (85).
    """

    def __init__(self, compat: Compat = "clean", region_slots: int = 36, word_slots: int = 85) -> None:
        super().__init__()
        if compat not in ("clean", "original"):
            raise ValueError(f"compat must be 'clean' or 'original', got {compat!r}.")
        self.compat = compat
        self.region_slots = region_slots
        self.word_slots = word_slots

    def context(self, img: Embeddings, txt: Embeddings, batch_layout: bool) -> dict[str, Any]:
        if self.compat != "original":
            return {"region_width": None, "word_width": None}
        if batch_layout:
            return {"region_width": int(img.lengths.max()), "word_width": int(txt.lengths.max())}
        return {"region_width": self.region_slots, "word_width": self.word_slots}

    @staticmethod
    def alignment(img: Embeddings, txt: Embeddings) -> torch.Tensor:
        """``[i, r, t, w]`` region x word cosines with padded slots that never win a max."""
        n_i, r, _ = img.tokens.shape
        n_t, w, _ = txt.tokens.shape
        return _flat_alignment(_pad_with_a_real_token(img), _pad_with_a_real_token(txt)).view(n_i, r, n_t, w)

    @staticmethod
    def _no_candidates(best: torch.Tensor, empty: torch.Tensor) -> torch.Tensor:
        # an item without any real token has no candidate for the max, as with -inf masking
        return best.masked_fill(empty, float("-inf")) if bool(empty.any()) else best

    def region_max(self, a: torch.Tensor, img: Embeddings, region_width: int | None) -> torch.Tensor:
        """Per image, text and word: the best region ``[i, t, w]``."""
        best = self._no_candidates(a.amax(dim=1), ~img.mask.any(dim=1)[:, None, None])
        if region_width is not None:
            padded = (img.lengths < region_width)[:, None, None]
            best = torch.where(padded, best.clamp_min(0), best)
        return best

    def word_max(self, a: torch.Tensor, txt: Embeddings, word_width: int | None) -> torch.Tensor:
        """Per image, text and region: the best word ``[i, t, r]``."""
        best = self._no_candidates(a.amax(dim=3).transpose(1, 2), ~txt.mask.any(dim=1)[None, :, None])
        if word_width is not None:
            padded = (txt.lengths < word_width)[None, :, None]
            best = torch.where(padded, best.clamp_min(0), best)
        return best

    def mrsw(self, a: torch.Tensor, img: Embeddings, txt: Embeddings, region_width: int | None) -> torch.Tensor:
        best = self.region_max(a, img, region_width)
        return best.masked_fill(~txt.mask[None], 0).sum(dim=2)

    def mwsr(self, a: torch.Tensor, img: Embeddings, txt: Embeddings, word_width: int | None) -> torch.Tensor:
        best = self.word_max(a, txt, word_width)
        return best.masked_fill(~img.mask[:, None], 0).sum(dim=2)


class MrSwPooler(AlignmentPooler):
    """Sum over words of the best region (TERAN's default).

    Example:
        >>> img = Embeddings(torch.eye(2).unsqueeze(0), torch.ones(1, 2, dtype=torch.bool))
        >>> MrSwPooler()(img, img)
        tensor([[2.]])
    """

    def pairwise(self, img: Embeddings, txt: Embeddings, region_width=None, word_width=None) -> torch.Tensor:
        return self.mrsw(self.alignment(img, txt), img, txt, region_width)


class MwSrPooler(AlignmentPooler):
    """Sum over regions of the best word.

    Example:
        >>> img = Embeddings(torch.eye(2).unsqueeze(0), torch.ones(1, 2, dtype=torch.bool))
        >>> MwSrPooler()(img, img)
        tensor([[2.]])
    """

    def pairwise(self, img: Embeddings, txt: Embeddings, region_width=None, word_width=None) -> torch.Tensor:
        return self.mwsr(self.alignment(img, txt), img, txt, word_width)


class SymmPooler(AlignmentPooler):
    """``MrSw + MwSr``.

    Example:
        >>> img = Embeddings(torch.eye(2).unsqueeze(0), torch.ones(1, 2, dtype=torch.bool))
        >>> SymmPooler()(img, img)
        tensor([[4.]])
    """

    def pairwise(self, img: Embeddings, txt: Embeddings, region_width=None, word_width=None) -> torch.Tensor:
        a = self.alignment(img, txt)
        return self.mrsw(a, img, txt, region_width) + self.mwsr(a, img, txt, word_width)


class MrAvgwPooler(AlignmentPooler):
    """``MrSw`` divided by the number of words of each text.

    Example:
        >>> img = Embeddings(torch.eye(2).unsqueeze(0), torch.ones(1, 2, dtype=torch.bool))
        >>> MrAvgwPooler()(img, img)
        tensor([[1.]])
    """

    def pairwise(self, img: Embeddings, txt: Embeddings, region_width=None, word_width=None) -> torch.Tensor:
        scores = self.mrsw(self.alignment(img, txt), img, txt, region_width)
        return scores / txt.lengths.to(scores.dtype)[None, :]


class GlobalCosinePooler(Pooler):
    """Cosine of the global vectors (TERN's CLS outputs); ``pooled`` must be unit-norm.

    Example:
        >>> e = Embeddings(torch.zeros(2, 1, 2), torch.ones(2, 1, dtype=torch.bool), torch.eye(2))
        >>> GlobalCosinePooler()(e, e)
        tensor([[1., 0.],
                [0., 1.]])
    """

    uses_tokens = False

    def pairwise(self, img: Embeddings, txt: Embeddings) -> torch.Tensor:
        if img.pooled is None or txt.pooled is None:
            raise ValueError(
                "the global-cosine pooler needs global vectors (Embeddings.pooled); use encoders "
                "with a CLS slot (image_encoder cls_slot=true, a BERT text encoder)."
            )
        return img.pooled @ txt.pooled.T
