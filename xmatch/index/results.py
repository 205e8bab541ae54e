"""What a search returns: ranked hits per query, with how much of the corpus was scored, which
stage placed each hit and how long each stage took."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

#: what placed a hit: the model's pooler (stage 2) or the verifier head (stage 3)
POOLER, VERIFIER = "pooler", "verifier"


@dataclass
class Hit:
    """One ranked item.

    Attributes:
        id: the item's id (an image name, or a caption id for caption indexes).
        score: the pooler's exact score (stage 2), whichever stage placed the hit: with
            ``rerank`` the re-scored hits are ordered by ``verifier``, not by ``score``, so
            ``score`` need not descend through them.
        row: the item's position in the index (append order).
        text: the caption, for caption indexes.
        verifier: the verifier head's match logit (stage 3), beside ``score``, for the hits it
            re-scored (``rerank``); None for the others.
        stage: what placed the hit: ``"verifier"`` (ranked by ``verifier``) or ``"pooler"``
            (ranked by ``score``).
    """

    id: str
    score: float
    row: int
    text: str | None = None
    verifier: float | None = None
    stage: str = POOLER


@dataclass
class SearchResult:
    """The top-k of one query.

    Attributes:
        hits: best first: the verifier's re-scored hits (in its order), then the pooler's.
        query: the query text (or image label), when known.
        scored: items scored exactly in stage 2 (stage 1 may have done more: see ``work``).
        total: items in the index.
        exact: True when the pooler's top-k (with ``rerank``: the top-K handed to the
            verifier) is proven to be the exhaustive ranking's (every item was scored, or
            the stage-1 bound rules the others out).
        stage1: the candidate generator used (``"exhaustive"`` for ``exact=True``).
        extra: what else the search reports: with centroid lists, the widths it ended at
            (``nprobe``: lists per query token, ``candidates``: items it ranked exactly) and
            ``settled`` (False where it reached its widest widths before its stopping test
            passed: a higher ``effort`` may find more); a cascade's ``shortlist_scored``;
            ``non_finite``: stored items that scored NaN or infinity and were left out (their
            stored values are damaged: ``index.verify()`` names them).
        reranked: hits the verifier re-scored (0 without ``rerank``).
        timings: milliseconds per query of each stage that ran: ``encode`` (the queries),
            ``stage1``, ``stage2``, ``verifier``; a cascade's ``shortlist`` (the first index's
            whole search) and ``cascade`` (the second model's encoding and scores). Each is the
            stage's time for the whole call divided by its number of queries.
        work: what stages 1 and 2 computed, in similarities: one per (query token, stored
            token) pair a stage scores, per centroid a query token is compared with, per
            stored token of a visited centroid list (its similarity is looked up), per item
            vector of a ``pooled`` / ``fde`` scan (for poolers of global vectors: one per item).
            The exact token scan of small corpora computes every stored token's, so it costs
            more than ``exact=True`` (which proves nothing it does not score). None where the
            engine does not say (Qdrant).
        work_exhaustive: the same count for scoring every item (``exact=True``).
    """

    hits: list[Hit]
    query: str | None = None
    scored: int = 0
    total: int = 0
    exact: bool = False
    stage1: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    reranked: int = 0
    timings: dict[str, float] = field(default_factory=dict)
    work: int | None = None
    work_exhaustive: int | None = None

    @property
    def ids(self) -> list[str]:
        return [h.id for h in self.hits]

    @property
    def exactness(self) -> str:
        """What backs the top-k (``exact`` says only whether it is proven):

        - ``"exhaustive"``: every item was scored;
        - ``"proven"``: the stage-1 bound rules out every item not scored;
        - ``"estimated"``: a widened search's stop test passed (``extra["settled"]``): an
          estimate, not a proof; it may miss items (a higher ``effort`` checks further);
        - ``"unsettled"``: the widened search reached its widest widths before the test passed;
        - ``"unchecked"``: a fixed number of candidates, nothing tested (``candidates``, the
          ``pooled`` or ``fde`` generators, Qdrant's HNSW graph, a cascade).

        Example:
            >>> SearchResult([], exact=False, extra={"settled": True}).exactness
            'estimated'
        """
        if self.exact:
            return "exhaustive" if self.scored == self.total else "proven"
        settled = self.extra.get("settled")
        if settled is None:
            return "unchecked"
        return "estimated" if settled else "unsettled"

    @property
    def scored_share(self) -> float:
        """The share of the corpus scored exactly."""
        return self.scored / self.total if self.total else 0.0

    @property
    def work_share(self) -> float | None:
        """``work`` as a share of scoring every item (above 1 where stage 1 scanned every token).

        Example:
            >>> SearchResult([], work=30, work_exhaustive=1000).work_share
            0.03
        """
        if self.work is None or not self.work_exhaustive:
            return None
        return self.work / self.work_exhaustive

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["hits"] = [{k: v for k, v in h.items() if v is not None} for h in out["hits"]]
        if not out["extra"]:
            out.pop("extra")
        out["exactness"] = self.exactness
        return out

    def text(self) -> str:
        """A printable ranking: rank, score (and the verifier's logit), id (and caption), then
        how the ranking was made and the time per query of each stage."""
        label = f"query: {self.query}\n" if self.query else ""
        lines = [f"{k:3d}. {h.score:9.4f}  " + (self._logit(h) if self.reranked else "") + h.id
                 + (f"  {h.text}" if h.text else "") for k, h in enumerate(self.hits, 1)]
        how = {"exhaustive": "exact (every item scored)", "proven": "exact (proven by the stage-1 bound)",
               "estimated": "exact: estimated (the widened search's stop test passed; not proven, it may miss items)",
               }.get(self.exactness, "two-stage")
        notes = f"  [{how}; {self.scored} of {self.total} items scored exactly"
        share = self.work_share
        notes += f"; work {100 * share:.3g} % of scoring every item]" if share is not None else "]"
        if self.extra.get("settled") is False:
            notes += ("\n  [not settled: the search reached its widest widths before it could tell the top-k is "
                      "complete; it may miss items (--effort 2 or more widens further)]")
        left_out = self.extra.get("non_finite")
        if left_out:
            notes += (f"\n  [{left_out} stored item{'' if left_out == 1 else 's'} scored NaN or infinity and "
                      f"{'was' if left_out == 1 else 'were'} left out: damaged stored values (xmatch search --verify "
                      "names them; rebuild the index with xmatch index ... --overwrite)]")
        if self.reranked:
            notes += (f"\n  [the verifier re-ranked the pooler's top {self.reranked}: first column the pooler's "
                      "score, second the verifier's logit]")
        if self.timings:
            notes += "\n  [time per query: " + ", ".join(f"{_STAGE_NAMES.get(s, s)} {ms:.1f} ms"
                                                        for s, ms in self.timings.items()) + "]"
        return label + "\n".join(lines) + "\n" + notes

    @staticmethod
    def _logit(hit: Hit) -> str:
        return f"{hit.verifier:9.4f}  " if hit.verifier is not None else f"{'-':>9}  "


_STAGE_NAMES = {"stage1": "stage 1", "stage2": "stage 2"}
