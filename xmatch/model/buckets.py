"""Token sets kept in length buckets, so that memory and scoring work follow the real number of
tokens instead of the longest item of a corpus.

``Embeddings`` pads every item to one width: one 54-word caption among 25,000 short ones makes
every caption 54 wide. :class:`BucketedEmbeddings` holds the same items as several
``Embeddings`` parts, each padded only to the widest item of its bucket (items of similar
length, at most ``max_waste`` of a bucket's slots padding), with each item's position in the
corpus. Poolers score bucket against bucket and put the scores back in corpus order, so
``model.similarity`` gives the same matrix (to float rounding) for the bucketed and the
padded corpus.

Example:
    >>> e = Embeddings(torch.randn(4, 6, 8), torch.arange(6)[None] < torch.tensor([[1], [6], [2], [6]]))
    >>> b = BucketedEmbeddings.from_embeddings(e)
    >>> [tuple(p.tokens.shape) for p in b.parts], b.slots, b.real_tokens
    ([(1, 1, 8), (1, 2, 8), (2, 6, 8)], 15, 15)
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from xmatch.model.embeddings import Embeddings, read_safetensors, write_safetensors
from xmatch.core.memory import release_free_memory

_FORMAT = "xmatch.bucketed-embeddings/1"
#: at most this share of a bucket's token slots is padding
DEFAULT_MAX_WASTE = 0.125


@dataclass
class BucketedEmbeddings:
    """Items in length buckets: ``parts[k]`` holds the items at corpus positions ``positions[k]``.

    Attributes:
        parts: ``Embeddings`` of similar-length items, each as narrow as its widest item.
        positions: per part, the corpus position of each of its items (``int64``); together
            they are a permutation of ``0 .. n-1``.
    """

    parts: list[Embeddings]
    positions: list[torch.Tensor]

    def __post_init__(self) -> None:
        if len(self.parts) != len(self.positions):
            raise ValueError(f"BucketedEmbeddings: {len(self.parts)} parts but {len(self.positions)} position lists.")
        if not self.parts:
            raise ValueError("BucketedEmbeddings needs at least one part.")
        dims = {p.dim for p in self.parts}
        if len(dims) != 1:
            raise ValueError(f"BucketedEmbeddings: parts of different widths {sorted(dims)}.")
        if len({p.pooled is not None for p in self.parts}) != 1:
            raise ValueError("BucketedEmbeddings: either every part has pooled vectors or none has.")
        if len({p.boxes is not None for p in self.parts}) != 1:
            raise ValueError("BucketedEmbeddings: either every part has region boxes or none has.")
        for part, pos in zip(self.parts, self.positions):
            if pos.dim() != 1 or len(pos) != len(part):
                raise ValueError(f"BucketedEmbeddings: a part of {len(part)} items has {tuple(pos.shape)} positions.")
        n = len(self)
        seen = torch.zeros(n, dtype=torch.bool)
        for pos in self.positions:
            if len(pos) and (int(pos.min()) < 0 or int(pos.max()) >= n):
                raise ValueError(f"BucketedEmbeddings: positions must lie in 0 .. {n - 1}.")
            seen[pos.cpu()] = True
        if not bool(seen.all()):
            raise ValueError("BucketedEmbeddings: the positions are not a permutation of the items.")

    # -- building ------------------------------------------------------------------------------

    @classmethod
    def from_embeddings(cls, e: Embeddings, max_waste: float = DEFAULT_MAX_WASTE) -> BucketedEmbeddings:
        """Bucket a padded corpus (its items keep their order as positions ``0 .. n-1``)."""
        return cls.from_parts([e], max_waste=max_waste)

    @classmethod
    def from_parts(
        cls,
        parts: Sequence[Embeddings],
        positions: Sequence[torch.Tensor] | None = None,
        max_waste: float = DEFAULT_MAX_WASTE,
        *,
        consume: bool = False,
    ) -> BucketedEmbeddings:
        """Bucket the items of several ``Embeddings`` (e.g. the batches of an encoding loop)
        without padding them all to one width first.

        Args:
            parts: the encoded batches.
            positions: each batch's corpus positions (default: the batches in order).
            max_waste: the largest share of padding slots a bucket may hold.
            consume: ``parts`` is a list this call may empty: each batch is released (its slot
                set to ``None``) as soon as its items are copied into their buckets, and buckets
                are filled in place, so the corpus is never held twice (peak memory about one
                batch above the corpus, instead of up to three times the corpus).
        """
        if not parts:
            raise ValueError("BucketedEmbeddings.from_parts needs at least one part.")
        if consume and not isinstance(parts, list):
            raise TypeError("from_parts(consume=True) needs the batches in a list it may empty.")
        plans = plan_buckets([token_spans(p.mask).cpu() for p in parts], positions, max_waste)
        if consume:
            release_free_memory()  # what the encoding loop freed before the buckets are allocated
        left = torch.tensor([len(p) for p in parts])
        out_parts, out_positions = [], []
        for plan in plans:
            bucket = _Bucket(parts[plan.like], len(plan.positions), plan.width)
            for k, rows in plan.rows:
                bucket.add(parts[k], rows.to(parts[k].tokens.device))
                left[k] -= len(rows)
                if consume and left[k] == 0:
                    parts[k] = None  # type: ignore[call-overload]
                    release_free_memory()  # the batch's pages, which glibc would keep as a heap hole
            out_parts.append(bucket.embeddings())
            out_positions.append(plan.positions)
        return cls(out_parts, out_positions)

    # -- views -----------------------------------------------------------------------------------

    def __len__(self) -> int:
        return sum(len(p) for p in self.parts)

    @property
    def dim(self) -> int:
        return self.parts[0].dim

    @property
    def lengths(self) -> torch.Tensor:
        """Real elements per item, in corpus order."""
        out = torch.empty(len(self), dtype=torch.long)
        for part, pos in zip(self.parts, self.positions):
            out[pos.cpu()] = part.lengths.cpu()
        return out

    @property
    def real_tokens(self) -> int:
        """Number of real (unmasked) tokens in the corpus."""
        return sum(int(p.mask.sum()) for p in self.parts)

    @property
    def slots(self) -> int:
        """Token slots held, padding included (``real_tokens / slots`` is the fill rate)."""
        return sum(p.mask.numel() for p in self.parts)

    def __getitem__(self, index: int | slice) -> Embeddings | BucketedEmbeddings:
        """``b[k]``: item ``k`` as a one-item ``Embeddings``; ``b[i:j]``: the items at corpus
        positions ``i .. j-1``, bucketed, with positions counted from ``i``."""
        n = len(self)
        if isinstance(index, int):
            k = index + n if index < 0 else index
            if not 0 <= k < n:
                raise IndexError(f"item {index} of {n}")
            for part, pos in zip(self.parts, self.positions):
                hit = (pos == k).nonzero()
                if len(hit):
                    return part[int(hit[0])].trimmed()
        if not isinstance(index, slice) or index.step not in (None, 1):
            raise TypeError("BucketedEmbeddings take an int or a contiguous slice; use to_embeddings() for more.")
        start, stop, _ = index.indices(n)
        parts, positions = [], []
        for part, pos in zip(self.parts, self.positions):
            piece = slice_bucket(part, pos, start, stop)
            if piece is not None:
                parts.append(piece[0])
                positions.append(piece[1])
        if not parts:
            raise IndexError(f"empty slice {start}:{stop} of {n} items")
        return BucketedEmbeddings(parts, positions)

    def to_embeddings(self) -> Embeddings:
        """One padded ``Embeddings`` in corpus order (as wide as the widest item)."""
        width = max(p.tokens.shape[1] for p in self.parts)
        first = self.parts[0]
        tokens = first.tokens.new_zeros(len(self), width, self.dim)
        mask = torch.zeros(len(self), width, dtype=torch.bool, device=first.mask.device)
        pooled = None if first.pooled is None else first.pooled.new_empty(len(self), self.dim)
        boxes = None if first.boxes is None else first.boxes.new_zeros(len(self), width, 4)
        for part, pos in zip(self.parts, self.positions):
            w = part.tokens.shape[1]
            at = pos.to(tokens.device)
            tokens[at, :w] = part.tokens
            mask[at, :w] = part.mask
            if pooled is not None:
                pooled[at] = part.pooled
            if boxes is not None:
                boxes[at, :w] = part.boxes
        return Embeddings(tokens, mask, pooled, boxes)

    def to(self, *args, **kwargs) -> BucketedEmbeddings:
        """Move / cast every part like ``Tensor.to``."""
        return BucketedEmbeddings([p.to(*args, **kwargs) for p in self.parts], self.positions)

    # -- disk --------------------------------------------------------------------------------------

    def save(self, path: str | os.PathLike, metadata: dict[str, str] | None = None) -> None:
        """Write to one ``.safetensors`` file (each bucket's tokens, mask, pooled, boxes,
        positions), atomically.

        Example:
            >>> e = Embeddings(torch.randn(3, 4, 8), torch.arange(4)[None] < torch.tensor([[1], [4], [2]]))
            >>> BucketedEmbeddings.from_embeddings(e).save("captions.safetensors")
            >>> BucketedEmbeddings.load("captions.safetensors").real_tokens
            7
        """
        tensors: dict[str, torch.Tensor] = {}
        for k, (part, pos) in enumerate(zip(self.parts, self.positions)):
            tensors[f"{k}.tokens"] = part.tokens.detach()
            tensors[f"{k}.mask"] = part.mask
            tensors[f"{k}.positions"] = pos.long()
            if part.pooled is not None:
                tensors[f"{k}.pooled"] = part.pooled.detach()
            if part.boxes is not None:
                tensors[f"{k}.boxes"] = part.boxes.detach()
        meta = {"format": _FORMAT, "parts": str(len(self.parts)), "user": json.dumps(metadata or {})}
        write_safetensors(path, tensors, meta)

    @classmethod
    def load(cls, path: str | os.PathLike, device: str | torch.device = "cpu") -> BucketedEmbeddings:
        """Read a file written by :meth:`save`."""
        with read_safetensors(path, device, "bucketed embeddings") as (f, meta):
            if meta.get("format") != _FORMAT:
                raise ValueError(
                    f"{path} is not a bucketed xmatch embeddings file (format {meta.get('format')!r}); "
                    "read plain ones with Embeddings.load."
                )
            keys = set(f.keys())
            parts, positions = [], []
            for k in range(int(meta["parts"])):
                pooled = f.get_tensor(f"{k}.pooled") if f"{k}.pooled" in keys else None
                boxes = f.get_tensor(f"{k}.boxes") if f"{k}.boxes" in keys else None
                parts.append(Embeddings(f.get_tensor(f"{k}.tokens"), f.get_tensor(f"{k}.mask"), pooled, boxes))
                positions.append(f.get_tensor(f"{k}.positions").cpu())
        return cls(parts, positions)


def slice_bucket(part: Embeddings, positions: torch.Tensor, start: int, stop: int) -> tuple[Embeddings, torch.Tensor] | None:
    """The items of one bucket at corpus positions ``start .. stop - 1`` (trimmed to their own
    widest) with their positions counted from ``start``, as ``BucketedEmbeddings[start:stop]``
    holds them; None when the bucket has none there.

    Example:
        >>> e = Embeddings(torch.randn(3, 4, 8), torch.arange(4)[None] < torch.tensor([[1], [4], [2]]))
        >>> piece, at = slice_bucket(e, torch.tensor([5, 2, 7]), 4, 8)
        >>> tuple(piece.tokens.shape), at.tolist()
        ((2, 2, 8), [1, 3])
    """
    keep = ((positions >= start) & (positions < stop)).nonzero().flatten()
    if len(keep) == len(part):  # a whole part: a view, so a slice of the corpus is not a copy of it
        return part.trimmed(), positions - start
    if not len(keep):
        return None
    first, last = int(keep[0]), int(keep[-1])
    # a run of neighbouring items (images kept in corpus order) is a view too
    rows = slice(first, last + 1) if last - first + 1 == len(keep) else keep.to(part.tokens.device)
    return part[rows].trimmed(), positions[keep] - start


@dataclass(frozen=True)
class BucketPlan:
    """One bucket that :meth:`BucketedEmbeddings.from_parts` makes of encoded batches, planned
    from the items' widths alone, so that the batches can wait elsewhere (a file) until their
    bucket is filled.

    Attributes:
        width: the bucket's width (its widest item's span).
        like: the batch whose dtypes and fields the bucket takes.
        rows: ``(batch, rows of it)`` in the order they fill the bucket.
        positions: the corpus position of each of the bucket's items, in that order.
    """

    width: int
    like: int
    rows: list[tuple[int, torch.Tensor]]
    positions: torch.Tensor

    def fill(self, batch: Callable[[int], Embeddings]) -> Embeddings:
        """The bucket's items, taken from ``batch(k)`` (the encoded batch ``k``).

        Example:
            >>> e = Embeddings(torch.randn(3, 4, 8), torch.arange(4)[None] < torch.tensor([[1], [4], [2]]))
            >>> [tuple(p.fill(lambda k: e).tokens.shape) for p in plan_buckets([torch.tensor([1, 4, 2])])]
            [(1, 1, 8), (1, 2, 8), (1, 4, 8)]
        """
        bucket = _Bucket(batch(self.like), len(self.positions), self.width)
        for k, rows in self.rows:
            part = batch(k)
            bucket.add(part, rows.to(part.tokens.device))
        return bucket.embeddings()


def plan_buckets(
    spans: Sequence[torch.Tensor], positions: Sequence[torch.Tensor] | None = None, max_waste: float = DEFAULT_MAX_WASTE
) -> list[BucketPlan]:
    """The buckets :meth:`BucketedEmbeddings.from_parts` makes of batches whose items need
    ``spans[k]`` slots (one past the last real token), at corpus ``positions[k]`` (default: the
    batches in order).

    Example:
        >>> [(p.width, p.positions.tolist()) for p in plan_buckets([torch.tensor([3, 12]), torch.tensor([2, 11])])]
        [(2, [2]), (3, [0]), (12, [1, 3])]
    """
    if not spans:
        raise ValueError("plan_buckets needs at least one batch.")
    if not 0 <= max_waste < 1:
        raise ValueError(f"max_waste must be in [0, 1), got {max_waste}.")
    if positions is None:
        starts = torch.tensor([0, *(len(s) for s in spans)]).cumsum(0)
        positions = [torch.arange(int(starts[k]), int(starts[k + 1])) for k in range(len(spans))]
    flat = torch.cat([s.cpu().long() for s in spans])
    owner = torch.cat([torch.full((len(s),), k) for k, s in enumerate(spans)])
    row = torch.cat([torch.arange(len(s)) for s in spans])
    where = torch.cat([pos.cpu().long() for pos in positions])
    order = torch.sort(flat, stable=True).indices
    plans = []
    for chosen in _bucket_runs(flat[order], max_waste):
        members = order[chosen]
        rows, pieces = [], []
        for k in owner[members].unique().tolist():
            mine = members[owner[members] == k]
            rows.append((k, row[mine]))
            pieces.append(where[mine])
        plans.append(BucketPlan(max(int(flat[members].max()), 1), int(owner[members[0]]), rows, torch.cat(pieces)))
    return plans


def token_spans(mask: torch.Tensor) -> torch.Tensor:
    """Per item, the width it needs: one past its last real token (0 when it has none); what
    :func:`plan_buckets` buckets by.

    Example:
        >>> token_spans(torch.tensor([[True, False, False], [True, True, True], [False, False, False]])).tolist()
        [1, 3, 0]
    """
    width = mask.shape[1]
    idx = torch.arange(1, width + 1, device=mask.device)
    return (mask * idx).amax(dim=1) if width else torch.zeros(len(mask), dtype=torch.long, device=mask.device)


def _bucket_runs(sorted_spans: torch.Tensor, max_waste: float) -> list[slice]:
    """Runs of the ascending spans whose padding stays within ``max_waste``: a bucket grows
    while its widest item is at most ``1 / (1 - max_waste)`` times its narrowest."""
    runs, start, n = [], 0, len(sorted_spans)
    values = sorted_spans.tolist()
    limit = 1 / (1 - max_waste)
    while start < n:
        low = max(values[start], 1)
        stop = start + 1
        while stop < n and values[stop] <= low * limit:
            stop += 1
        runs.append(slice(start, stop))
        start = stop
    return runs


class _Bucket:
    """One bucket's tensors, allocated once and filled piece by piece (no concatenation, which
    would hold every piece and the result at once). ``torch.empty`` leaves the pages
    untouched until a piece is written, so memory grows as the source batches are released."""

    def __init__(self, like: Embeddings, n: int, width: int) -> None:
        t = like.tokens
        self.width, self.filled = width, 0
        self.tokens = torch.empty((n, width, *t.shape[2:]), dtype=t.dtype, device=t.device)
        self.mask = torch.empty((n, width), dtype=torch.bool, device=t.device)
        self.pooled = None if like.pooled is None else torch.empty((n, *like.pooled.shape[1:]),
                                                                   dtype=like.pooled.dtype, device=t.device)
        self.boxes = None if like.boxes is None else torch.empty((n, width, *like.boxes.shape[2:]),
                                                                 dtype=like.boxes.dtype, device=t.device)

    def add(self, part: Embeddings, rows: torch.Tensor) -> None:
        at = slice(self.filled, self.filled + len(rows))
        have = min(part.tokens.shape[1], self.width)
        for dst, src in ((self.tokens, part.tokens), (self.mask, part.mask), (self.boxes, part.boxes)):
            if dst is not None:
                dst[at, :have] = src[rows, :have]
                dst[at, have:] = 0  # padding columns: zeros, as Embeddings pads
        if self.pooled is not None:
            self.pooled[at] = part.pooled[rows]
        self.filled += len(rows)

    def embeddings(self) -> Embeddings:
        return Embeddings(self.tokens, self.mask, self.pooled, self.boxes)
