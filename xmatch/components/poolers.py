"""Poolers: from region and word embeddings to one image-sentence score.

TERAN (Messina et al., ACM TOMM 2021) pools the region x word cosine matrix ``A``:
``MrSw = sum_words max_regions A``, ``MwSr = sum_regions max_words A``,
``Symm = MrSw + MwSr`` and ``MrAvgw = MrSw / number of words``. TERN (ICPR 2020) scores the
cosine of the two CLS outputs (``global-cosine``). The four alignment poolers derive from
:class:`~xmatch.components.alignment.AlignmentPooler`, which computes ``A`` with
:func:`~xmatch.components.alignment.pairwise_cosines` and takes its maxima.

Masked positions never win a max (they are ``-inf``). With ``compat="original"`` the pooler
reproduces the original code, which zero-fills masked cells *before* the max: every max over a
set that is narrower than the padded width also sees a 0 candidate. The original evaluation
pads images to 36 regions and captions to 85 alignment slots (its fixed widths 37 and 88 minus
the dropped slots); its training pads to the batch maximum (``batch_layout=True``).
"""

from __future__ import annotations

from typing import Any, Literal

import torch

from xmatch.components.alignment import AlignmentPooler
from xmatch.model.interfaces import Pooler
from xmatch.model.embeddings import Embeddings

Compat = Literal["clean", "original"]


class TeranPooler(AlignmentPooler):
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
    def _zero_candidate(best: torch.Tensor, narrower: torch.Tensor) -> torch.Tensor:
        # the original's zero-filled cells: a max over a set narrower than the padded width
        # also sees a 0
        return torch.where(narrower, best.clamp_min(0), best)

    def paired(self, img: Embeddings, txt: Embeddings, *, batch_layout: bool = False) -> torch.Tensor:
        """Scores ``[n]`` of the row-aligned pairs ``(img[k], txt[k])`` in one batched product:
        ``self(img, txt).diagonal()`` without the other pairs (see :meth:`~xmatch.plugin.Pooler.paired`).

        Example:
            >>> e = Embeddings(torch.eye(2).expand(3, 2, 2), torch.ones(3, 2, dtype=torch.bool))
            >>> SymmPooler().paired(e, e)
            tensor([4., 4., 4.])
        """
        if len(img) != len(txt) or type(self).pool_pairs is TeranPooler.pool_pairs:
            # the base names a mismatch, and scores a subclass without pool_pairs pair by pair
            return super().paired(img, txt, batch_layout=batch_layout)
        context = self.context(img, txt, batch_layout)
        a = self.paired_alignment(img, txt)
        # the reductions of mrsw/mwsr with the pair axis in place of the image and text axes
        region_best = self._no_candidates(a.amax(dim=1), ~img.mask.any(dim=1)[:, None])
        if context["region_width"] is not None:
            region_best = self._zero_candidate(region_best, (img.lengths < context["region_width"])[:, None])
        word_best = self._no_candidates(a.amax(dim=2), ~txt.mask.any(dim=1)[:, None])
        if context["word_width"] is not None:
            word_best = self._zero_candidate(word_best, (txt.lengths < context["word_width"])[:, None])
        return self.pool_pairs(region_best.masked_fill(~txt.mask, 0).sum(dim=1),
                               word_best.masked_fill(~img.mask, 0).sum(dim=1), txt)

    def pool_pairs(self, mrsw: torch.Tensor, mwsr: torch.Tensor, txt: Embeddings) -> torch.Tensor | None:
        """The pooler's score of each pair from its ``MrSw`` and ``MwSr`` sums, for :meth:`paired`;
        None here: a subclass that does not override it is scored pair by pair."""
        return None

    def mrsw(self, a: torch.Tensor, img: Embeddings, txt: Embeddings, region_width: int | None) -> torch.Tensor:
        best = self.region_max(a, img)
        if region_width is not None:
            best = self._zero_candidate(best, (img.lengths < region_width)[:, None, None])
        return best.masked_fill(~txt.mask[None], 0).sum(dim=2)

    def mwsr(self, a: torch.Tensor, img: Embeddings, txt: Embeddings, word_width: int | None) -> torch.Tensor:
        best = self.word_max(a, txt)
        if word_width is not None:
            best = self._zero_candidate(best, (txt.lengths < word_width)[None, :, None])
        return best.masked_fill(~img.mask[:, None], 0).sum(dim=2)


class MrSwPooler(TeranPooler):
    """Sum over words of the best region (TERAN's default).

    Example:
        >>> img = Embeddings(torch.eye(2).unsqueeze(0), torch.ones(1, 2, dtype=torch.bool))
        >>> MrSwPooler()(img, img)
        tensor([[2.]])
    """

    def pool_pairs(self, mrsw: torch.Tensor, mwsr: torch.Tensor, txt: Embeddings) -> torch.Tensor:
        return mrsw

    def pairwise(self, img: Embeddings, txt: Embeddings, region_width=None, word_width=None) -> torch.Tensor:
        return self.mrsw(self.alignment(img, txt), img, txt, region_width)


class MwSrPooler(TeranPooler):
    """Sum over regions of the best word.

    Example:
        >>> img = Embeddings(torch.eye(2).unsqueeze(0), torch.ones(1, 2, dtype=torch.bool))
        >>> MwSrPooler()(img, img)
        tensor([[2.]])
    """

    def pool_pairs(self, mrsw: torch.Tensor, mwsr: torch.Tensor, txt: Embeddings) -> torch.Tensor:
        return mwsr

    def pairwise(self, img: Embeddings, txt: Embeddings, region_width=None, word_width=None) -> torch.Tensor:
        return self.mwsr(self.alignment(img, txt), img, txt, word_width)


class SymmPooler(TeranPooler):
    """``MrSw + MwSr``.

    Example:
        >>> img = Embeddings(torch.eye(2).unsqueeze(0), torch.ones(1, 2, dtype=torch.bool))
        >>> SymmPooler()(img, img)
        tensor([[4.]])
    """

    def pool_pairs(self, mrsw: torch.Tensor, mwsr: torch.Tensor, txt: Embeddings) -> torch.Tensor:
        return mrsw + mwsr

    def pairwise(self, img: Embeddings, txt: Embeddings, region_width=None, word_width=None) -> torch.Tensor:
        a = self.alignment(img, txt)
        return self.mrsw(a, img, txt, region_width) + self.mwsr(a, img, txt, word_width)


class MrAvgwPooler(TeranPooler):
    """``MrSw`` divided by the number of words of each text.

    Example:
        >>> img = Embeddings(torch.eye(2).unsqueeze(0), torch.ones(1, 2, dtype=torch.bool))
        >>> MrAvgwPooler()(img, img)
        tensor([[1.]])
    """

    def pool_pairs(self, mrsw: torch.Tensor, mwsr: torch.Tensor, txt: Embeddings) -> torch.Tensor:
        return mrsw / txt.lengths.to(mrsw.dtype)

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

    def paired(self, img: Embeddings, txt: Embeddings, *, batch_layout: bool = False) -> torch.Tensor:
        """Cosines ``[n]`` of the row-aligned pairs' global vectors (:meth:`~xmatch.plugin.Pooler.paired`)."""
        if len(img) != len(txt) or img.pooled is None or txt.pooled is None:
            return super().paired(img, txt, batch_layout=batch_layout)  # pairwise names what is missing
        return (img.pooled * txt.pooled).sum(dim=-1)
