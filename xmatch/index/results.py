"""What a search returns: ranked hits per query, with how much of the corpus was scored."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class Hit:
    """One ranked item.

    Attributes:
        id: the item's id (an image name, or a caption id for caption indexes).
        score: the model's exact score (its pooler's).
        row: the item's position in the index (append order).
        text: the caption, for caption indexes.
    """

    id: str
    score: float
    row: int
    text: str | None = None


@dataclass
class SearchResult:
    """The top-k of one query.

    Attributes:
        hits: best first.
        query: the query text (or image label), when known.
        scored: items scored exactly in stage 2.
        total: items in the index.
        exact: True when the top-k is proven to be the exhaustive ranking's (every item was
            scored, or the stage-1 bound rules the others out).
        stage1: the candidate generator used (``"exhaustive"`` for ``exact=True``).
    """

    hits: list[Hit]
    query: str | None = None
    scored: int = 0
    total: int = 0
    exact: bool = False
    stage1: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ids(self) -> list[str]:
        return [h.id for h in self.hits]

    @property
    def scored_share(self) -> float:
        """The share of the corpus scored exactly."""
        return self.scored / self.total if self.total else 0.0

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["hits"] = [{k: v for k, v in h.items() if v is not None} for h in out["hits"]]
        if not out["extra"]:
            out.pop("extra")
        return out

    def text(self) -> str:
        """A printable ranking: rank, score, id (and caption)."""
        label = f"query: {self.query}\n" if self.query else ""
        lines = [f"{k:3d}. {h.score:9.4f}  {h.id}" + (f"  {h.text}" if h.text else "") for k, h in enumerate(self.hits, 1)]
        how = "exact (every item scored)" if self.exact and self.scored == self.total else (
            "exact (proven by the stage-1 bound)" if self.exact else "two-stage")
        return label + "\n".join(lines) + f"\n  [{how}; {self.scored} of {self.total} items scored exactly]"
