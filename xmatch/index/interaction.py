"""How each pooler combines token similarities, as far as candidate generation needs to know.

TERAN's poolers are sums of maxima over the region x word cosine matrix (a late interaction,
as ColBERT's MaxSim): ``MrSw`` sums over the words the best region, ``MwSr`` sums over the
regions the best word, ``Symm`` is both, ``MrAvgw`` is ``MrSw`` per word. Token retrieval
bounds such scores from above (:mod:`xmatch.index.candidates`); for these four poolers in the
clean mode the bound is exact arithmetic, so a search over an exact (flat) token index can
prove its top-k exact. SCAN's attention poolers and the Sum-Max baselines are driven by the
same region-word cosines (a softmax or a max over one side, a sum or LSE over the other), so
the same candidates serve them, without the proof. Poolers that read only the global vectors
(``uses_tokens = False``) get candidates from those vectors.
"""

from __future__ import annotations

from dataclasses import dataclass

from xmatch.model.interfaces import Pooler
from xmatch.components.poolers import (
    GlobalCosinePooler,
    MrAvgwPooler,
    MrSwPooler,
    MwSrPooler,
    SymmPooler,
    TeranPooler,
)


@dataclass(frozen=True)
class Interaction:
    """Which sums of maxima a pooler's score is made of.

    Attributes:
        text_sum: sum over the caption's words of the best region (MrSw).
        image_sum: sum over the image's regions of the best word (MwSr).
        per_word: the sum is divided by the caption's number of words (MrAvgw).
        bounded: the token bound is an upper bound of the pooler's score (exactness can be proved).
    """

    text_sum: bool
    image_sum: bool
    per_word: bool = False
    bounded: bool = False


_TERAN = {
    MrSwPooler: Interaction(True, False), MwSrPooler: Interaction(False, True), SymmPooler: Interaction(True, True),
    MrAvgwPooler: Interaction(True, False, per_word=True),
}
#: registered names of poolers from plugins whose scores follow one side's sum of best matches
_BY_NAME = {
    "scan-t2i": Interaction(True, False), "scan-sum-max-t2i": Interaction(True, False),
    "scan-i2t": Interaction(False, True), "scan-sum-max-i2t": Interaction(False, True),
}
#: any other token pooler: both directions, the safest proxy for an unknown interaction
GENERIC = Interaction(True, True)


def interaction(pooler: Pooler, name: str | None = None) -> Interaction | None:
    """The interaction of ``pooler`` (registered as ``name``), or None for poolers that read
    only the global vectors.

    Example:
        >>> interaction(MrSwPooler())
        Interaction(text_sum=True, image_sum=False, per_word=False, bounded=True)
    """
    if not pooler.uses_tokens:
        return None
    found = _TERAN.get(type(pooler))
    if found is not None:
        clean = isinstance(pooler, TeranPooler) and pooler.compat == "clean"
        return Interaction(found.text_sum, found.image_sum, found.per_word, bounded=clean)
    return _BY_NAME.get((name or "").lower(), GENERIC)


def pooled_is_exact(pooler: Pooler) -> bool:
    """Whether the global vectors' inner product is the pooler's score itself (TERN)."""
    return type(pooler) is GlobalCosinePooler
