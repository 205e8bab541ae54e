"""Stage 1: propose candidates, after the late-interaction engines.

- ``tokens`` (ColBERT / PLAID / XTR): each query token reaches the stored tokens nearest to it,
  and an item's score is estimated as the pooler's sum of maxima over what was reached, every
  similarity that was not reached imputed with the query token's last reached similarity
  (XTR's missing-similarity imputation). Up to :data:`~xmatch.index.ann.FLAT_LIMIT` stored
  tokens the reach is an exact scan of every token: the estimate is then the exact sum of
  maxima, an upper bound of the MrSw / MwSr / Symm / MrAvgw score that equals it in the clean
  mode, which lets :class:`~xmatch.index.SearchIndex` prove a top-k exact. Beyond, PLAID's
  centroid lists (:mod:`xmatch.index.centroids`): every token of the ``nprobe`` lists nearest
  each query token, scored by its centroid; a search widens ``nprobe`` per query
  (:class:`Widening`, :meth:`~xmatch.index.ranking.Ranking._widened`). The default for token
  poolers.
- ``pooled``: one vector per item in FAISS: the model's global vectors when both sides have
  them (TERN's CLS outputs; then the inner product *is* the ``global-cosine`` score), else the
  mean of the tokens. The default for poolers that read only global vectors.
- ``fde`` (MUVERA): one fixed encoding per item in FAISS, whose inner product estimates the
  sum of maxima (:mod:`xmatch.index.fde`).

Every generator reports its work per query (:attr:`Candidates.work`: similarities computed or
looked up), so that a result can say what it cost against scoring every item.

Stage-1 files live in ``INDEX/ann`` with the number of items they cover; items appended since
are added when the generator is next used; a corpus that outgrows an exact scan gets the
approximate structure. Every file is derived from the shards: deleting one rebuilds it. A stored
vector holding NaN or infinity (damaged values) is left out of them: it would poison FAISS's
training and rank first; stage 2 leaves its item out too (:mod:`xmatch.index.rerank`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from xmatch.model.embeddings import Embeddings
from xmatch.index import ann
from xmatch.index.ann import VectorIndex
from xmatch.index.centroids import CentroidLists, list_count
from xmatch.index.fde import FixedEncoder
from xmatch.index.interaction import Interaction
from xmatch.index.store import ShardStore, own_folder
from xmatch.core.progress import progress_bar

#: token ids are ``row * SLOTS + position``: an item holds at most this many tokens
SLOTS = 1024
#: the imputed similarity when nothing is left unreached: below any cosine of unit vectors
#: (float16 storage may stretch one a little past -1), yet small, so float32 sums of it stay exact
NOTHING = -2.0
GENERATORS = ("tokens", "pooled", "fde")
#: centroid lists visited per query token when ``nprobe`` is given no value and nothing widens
#: (stage 1 alone, :meth:`TokenGenerator.propose`)
DEFAULT_NPROBE = 8


@dataclass
class Candidates:
    """Per query: candidate rows, best estimate first; with a provable generator, also an
    upper bound of each listed row's exact score and one (``floor``) for every other row.

    Attributes:
        rows: one ``int64`` tensor per query.
        bounds: one float tensor per query, aligned with ``rows``; None when not provable.
        floor: ``[Q]`` upper bound of the rows not listed; None when not provable.
        work: ``[Q]`` similarities stage 1 computed or looked up per query (see
            :attr:`~xmatch.index.results.SearchResult.work`); None when the engine does not say.
    """

    rows: list[torch.Tensor]
    bounds: list[torch.Tensor] | None = None
    floor: torch.Tensor | None = None
    work: torch.Tensor | None = None


class FaissGenerator:
    """Shared machinery: the FAISS index of one generator, synchronised with the store.

    Subclasses set ``per_item`` and implement :meth:`item_vectors`.
    """

    name: str
    per_item: bool

    def __init__(self, store: ShardStore, folder: Path, *, writable: bool = True, progress: bool = False) -> None:
        self.store, self.folder, self.writable, self.progress = store, folder, writable, progress
        self.index: VectorIndex | None = None
        self.covered = 0

    @property
    def path(self) -> Path:
        return self.folder / f"{self.file_stem}.faiss"

    @property
    def file_stem(self) -> str:
        return self.name

    def settings(self) -> dict[str, Any]:
        """What the stored vectors depend on besides the items (checked when loading)."""
        return {}

    def item_vectors(self, start: int, e: Embeddings) -> tuple[np.ndarray, np.ndarray]:
        raise NotImplementedError  # pragma: no cover - interface

    def vector_count(self) -> int:
        return len(self.store) if self.per_item else int(self.store.lengths().sum())  # cached per shard

    @property
    def exact(self) -> bool:
        """Whether the current FAISS index is an exact scan."""
        return self.index is not None and self.index.kind == "flat"

    def sync(self) -> None:
        """Bring the FAISS index up to the store's items: load, extend or (re)build it."""
        n = len(self.store)
        if self.index is not None and self.covered == n:
            return
        if self.index is None:
            loaded = VectorIndex.load(self.path)
            if loaded is not None:
                index, meta = loaded
                if meta.get("settings") == self.settings() and int(meta.get("items", -1)) <= n:
                    self.index, self.covered = index, int(meta["items"])
        kind = ann.choose_kind(self.vector_count()) if self.per_item else "flat"
        if self.index is None or self.index.kind != kind:
            self.index, self.covered = VectorIndex(self._dim(), kind), 0
        if self.covered < n:
            self._add_rows(self.covered)
            if self.writable:
                own_folder(self.folder.parent, self.folder.name)
                self.index.save(self.path, {"items": n, "settings": self.settings(), "generator": self.name})

    def _dim(self) -> int:
        return self.store.shards[0].tokens.shape[2]

    def _add_rows(self, first: int) -> None:
        blocks = progress_bar(self.store.blocks(first), total=self._shards_from(first),
                              desc=f"stage-1 index ({self.name})", unit="shard", show=self.progress)
        for start, e in blocks:
            vectors, ids = self.item_vectors(start, e)
            if len(vectors):
                self.index.add(vectors, ids)
        self.covered = len(self.store)

    def _shards_from(self, first: int) -> int:
        return int((self.store.starts[1:] > first).sum())

    def _scan_work(self, n_queries: int) -> torch.Tensor | None:
        """Similarities per query of a search over one vector per item: every item's in an exact
        scan; None for a graph (HNSW visits are not counted)."""
        return torch.full((n_queries,), len(self.store), dtype=torch.long) if self.exact else None


class TokenGenerator(FaissGenerator):
    """ColBERT/PLAID/XTR-style candidates from the stored tokens nearest each query token.

    Up to :data:`~xmatch.index.ann.FLAT_LIMIT` stored tokens, an exact scan (one matrix product
    over the stored token sets, held in memory) reaches every stored token: the estimate is then
    the exact sum of maxima (an upper bound of the pooler's score, see the module docstring). Beyond, PLAID's centroid lists
    (:class:`~xmatch.index.centroids.CentroidLists`) visit the ``nprobe`` nearest lists of each
    query token.

    Args:
        store: the corpus.
        folder: where the stage-1 files live (``INDEX/ann``).
        interaction: the pooler's sums of maxima (:mod:`xmatch.index.interaction`).
        side: what the store holds, ``"images"`` or ``"texts"``.
        nprobe: centroid lists visited per query token (centroid lists).
    """

    name = "tokens"
    per_item = False
    #: dense scores held at once while estimating: query tokens x items
    block_elements = 1 << 24

    def __init__(
        self, store: ShardStore, folder: Path, interaction: Interaction, side: str, *,
        nprobe: int = DEFAULT_NPROBE, writable: bool = True, progress: bool = False,
    ) -> None:
        super().__init__(store, folder, writable=writable, progress=progress)
        self.interaction, self.side, self.nprobe = interaction, side, nprobe
        self.lists: CentroidLists | None = None
        self.flat: Embeddings | None = None  # exact scan: every stored token set, float32
        self._lengths: torch.Tensor | None = None
        self._buffer: torch.Tensor | None = None

    @property
    def lists_path(self) -> Path:
        return self.folder / "tokens.lists.npz"

    @property
    def exact(self) -> bool:
        return self.lists is None and self.flat is not None

    def item_vectors(self, start: int, e: Embeddings) -> tuple[np.ndarray, np.ndarray]:
        if e.tokens.shape[1] > SLOTS:
            raise ValueError(f"the token index keeps at most {SLOTS} tokens per item, an item has {e.tokens.shape[1]}.")
        item, slot = (e.mask & torch.isfinite(e.tokens).all(dim=-1)).nonzero(as_tuple=True)
        ids = (item + start) * SLOTS + slot
        return e.tokens[item, slot].float().numpy(), ids.numpy()

    def lengths(self) -> torch.Tensor:
        if self._lengths is None or len(self._lengths) != len(self.store):
            self._lengths = self.store.lengths()
        return self._lengths

    def sync(self) -> None:
        n = len(self.store)
        if self.vector_count() <= ann.FLAT_LIMIT:
            if self.flat is None or self.covered < n:  # small: gathered from the shards, not stored
                parts = [e for _, e in self.store.blocks(self.covered)]
                self.flat = Embeddings.cat(([self.flat] if self.flat is not None else []) + parts)
                self.covered = n
            return
        if self.lists is None:
            loaded = CentroidLists.load(self.lists_path)
            if loaded is not None and loaded[1] <= n:
                self.lists, self.covered = loaded
            else:
                self.lists, self.covered = self._train_lists(), 0
            self.flat = None
        if self.covered == n:
            return
        for start, e in progress_bar(self.store.blocks(self.covered), total=self._shards_from(self.covered),
                                     desc="stage-1 centroid lists", unit="shard", show=self.progress):
            vectors, ids = self.item_vectors(start, e)
            self.lists.add(vectors, ids // SLOTS)
        self.covered = n
        if self.writable:
            own_folder(self.folder.parent, self.folder.name)
            self.lists.save(self.lists_path, n)

    def _train_lists(self, seed: int = 0) -> CentroidLists:
        count = list_count(self.vector_count())
        per_row = max(1, self.vector_count() // max(len(self.store), 1))
        rows = torch.randperm(len(self.store), generator=torch.Generator().manual_seed(seed))
        rows = rows[: max(1, count * 64 // per_row)].sort().values
        sample, _ = self.item_vectors(0, self.store.gather(rows))
        return CentroidLists.train(sample, count, seed)

    def _visits(self, vectors: torch.Tensor, nprobe: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(query token, stored token, owner, similarity)`` of every token in the ``nprobe``
        centroid lists nearest each query token, and the imputed value of each query token."""
        m, slot, sim, theta = self.lists.probe(vectors.numpy(), nprobe)
        order, _, owners = self.lists.csr()
        # the token itself is needed only to sum over an item's tokens (item-side sums)
        token = order[slot] if self._corpus_sum else slot
        return m, token, owners[slot], sim, theta

    def propose(self, query: Embeddings, n: int) -> Candidates:
        self.sync()
        provable = self.exact and self.interaction.bounded
        rows, bounds, floors, work = [], [], [], []
        n_items = len(self.store)
        width = self.flat.tokens.shape[1] if self.flat is not None else 1
        per_chunk = max(1, self.block_elements // max(1, n_items * width * query.tokens.shape[1]))
        for start in range(0, len(query), per_chunk):  # dense estimates of a few queries at a time
            part = query[start : start + per_chunk]
            approx, spent = self.estimates(part)
            work.append(spent)
            # provable: every item, by decreasing bound (an exact scan means a small corpus), so
            # that stage 2 can score on until the bound proves the top-k
            top = approx.sort(dim=1, descending=True) if provable else approx.topk(min(n, n_items), dim=1)
            rows += list(top.indices)
            if provable:
                bounds += list(top.values)
                floors.append(torch.full((len(part),), -torch.inf))
        return Candidates(rows, bounds if provable else None, torch.cat(floors) if provable else None, torch.cat(work))

    def estimates(self, part: Embeddings, nprobe: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Every item's estimated score for each query of ``part`` (after :meth:`sync`).

        Args:
            part: a few queries (their dense ``[Q, N]`` estimates are held at once).
            nprobe: centroid lists visited per query token (default: :attr:`nprobe`).

        Returns:
            ``(estimates [Q, N], work [Q])``: the work is the similarities computed or looked up
            per query: every stored token's for the exact scan; with centroid lists, every
            centroid's (the probe) plus one per token of a visited list.
        """
        if self.flat is not None:
            return self._exact_sums(part), part.lengths.long() * self._flat_tokens()
        q_of, slot = part.mask.nonzero(as_tuple=True)
        m, token, owner, sim, theta = self._visits(part.tokens[q_of, slot].float(), nprobe or self.nprobe)
        approx = self._estimate(len(part), q_of, m, token, owner, sim, theta, part.lengths.float())
        visited = torch.bincount(q_of[m], minlength=len(part))
        return approx, visited + part.lengths.long() * len(self.lists.centroids)

    def _flat_tokens(self) -> int:
        return int(self.flat.mask.sum())

    def widening(self, query: Embeddings) -> Widening:
        """Estimates of one query (after :meth:`sync`, centroid lists) that can visit more lists."""
        return Widening(self, query)

    def _exact_sums(self, part: Embeddings) -> torch.Tensor:
        """``[Q, N]`` the sums of maxima over every stored token (a small corpus): for MrSw,
        MwSr, Symm and MrAvgw in the clean mode, their exact scores."""
        flat = self.flat
        n_items, width, dim = flat.tokens.shape
        q_of, slot = part.mask.nonzero(as_tuple=True)
        sims = (flat.tokens.reshape(-1, dim) @ part.tokens[q_of, slot].float().T).view(n_items, width, -1)
        sims = sims.masked_fill(~flat.mask[..., None], -torch.inf)  # [N, T, query tokens]
        approx = torch.zeros(len(part), n_items)
        bounds = torch.searchsorted(q_of, torch.arange(len(part) + 1)).tolist()  # each query's columns
        lengths = flat.mask.sum(dim=1).float()
        for q in range(len(part)):  # a column block per query of the chunk
            if bounds[q] == bounds[q + 1]:  # a query without tokens matches nothing
                approx[q] = -torch.inf
                continue
            own = sims[:, :, bounds[q] : bounds[q + 1]]
            if self._query_sum:
                best = own.amax(dim=1).sum(dim=1)
                approx[q] += best / (bounds[q + 1] - bounds[q]) if self._per_query_word else best
            if self._corpus_sum:
                best = own.amax(dim=2).masked_fill(~flat.mask, 0).sum(dim=1)
                approx[q] += best / lengths.clamp_min(1) if self._per_corpus_word else best
        return approx

    def _estimate(self, n_queries, q_of, m, token, owner, sim, theta, q_len) -> torch.Tensor:
        """``[Q, N]`` imputed sums of maxima of every query and item.

        Query-side sum (MrSw for text queries): ``sum_m theta_m + sum_m max(best_m - theta_m, 0)``,
        ``best_m`` the item's best visited similarity to query token ``m``. Item-side sum (MwSr
        for text queries): ``len(item) * max_m theta_m`` plus, over the item's visited tokens,
        ``max(best - max_m theta_m, 0)``. Every item gets a value; one not visited at all, the
        imputed values alone.
        """
        n_items = len(self.store)
        lengths = self.lengths().float()
        approx = torch.zeros(n_queries, n_items)
        if self._query_sum:
            gain = (sim - theta[m]).clamp_min(0)
            best = self._scratch(len(theta) * n_items).scatter_reduce_(0, m * n_items + owner, gain, "amax")
            best = best.view(len(theta), n_items)
            bounds = torch.searchsorted(q_of, torch.arange(n_queries + 1))  # q_of ascends: each query's rows
            for q in range(n_queries):  # a row-block sum per query of the chunk
                approx[q] += best[bounds[q] : bounds[q + 1]].sum(0)
            approx += torch.zeros(n_queries).index_add_(0, q_of, theta)[:, None]
            if self._per_query_word:
                approx /= q_len[:, None]
        if self._corpus_sum:
            theta_max = torch.full((n_queries,), NOTHING).scatter_reduce(0, q_of, theta, "amax")
            span = int(token.max()) + 1 if len(token) else 1
            keys, inverse = torch.unique(q_of[m] * span + token, return_inverse=True)
            best = torch.full((len(keys),), -torch.inf).scatter_reduce(0, inverse, sim, "amax")
            key_owner = torch.zeros(len(keys), dtype=torch.long).scatter_(0, inverse, owner)
            key_query = keys // span
            gain = (best - theta_max[key_query]).clamp_min(0)
            part = torch.zeros(n_queries * n_items).index_add_(0, key_query * n_items + key_owner, gain)
            part = part.view(n_queries, n_items) + theta_max[:, None] * lengths[None]
            approx += part / lengths.clamp_min(1)[None] if self._per_corpus_word else part
        return approx

    def _scratch(self, size: int) -> torch.Tensor:
        """A zeroed buffer kept between queries: clearing mapped memory is cheaper than a fresh
        allocation's page faults, which dominate on small, busy machines."""
        if self._buffer is None or len(self._buffer) < size:
            self._buffer = torch.zeros(size)
            return self._buffer
        return self._buffer[:size].zero_()

    # which sums of maxima run over the query's tokens and which over the stored item's
    @property
    def _query_sum(self) -> bool:
        return self.interaction.text_sum if self.side == "images" else self.interaction.image_sum

    @property
    def _corpus_sum(self) -> bool:
        return self.interaction.image_sum if self.side == "images" else self.interaction.text_sum

    @property
    def _per_query_word(self) -> bool:
        return self.interaction.per_word and self.side == "images"

    @property
    def _per_corpus_word(self) -> bool:
        return self.interaction.per_word and self.side == "texts"


class Widening:
    """Stage-1 estimates of one query over centroid lists, widened step by step: each
    :meth:`to` visits only the lists not visited before when the query's tokens are summed
    (each query token's best similarity per item is kept); estimates with an item-side sum are
    computed again from all the lists.

    Example:
        >>> widening = generator.widening(query)  # a TokenGenerator over centroid lists  # doctest: +SKIP
        >>> approx, work = widening.to(16)  # doctest: +SKIP
        >>> approx, more = widening.to(32)  # lists 17 to 32 of each query token  # doctest: +SKIP
    """

    def __init__(self, generator: TokenGenerator, query: Embeddings) -> None:
        self.generator, self.query = generator, query
        self.vectors = query.tokens[query.mask].float()
        self.nprobe = 0
        self.best: torch.Tensor | None = None  # [query tokens x items] best similarity reached

    def to(self, nprobe: int) -> tuple[torch.Tensor, int]:
        """``(estimate of every item [N], work of this step)`` with ``nprobe`` lists visited per
        query token (more than at the previous step)."""
        g = self.generator
        if g._corpus_sum:
            approx, work = g.estimates(self.query, nprobe)
            return approx[0], int(work[0])
        lists, n_items = g.lists, len(g.store)
        m, slot, sim, theta = lists.probe(self.vectors.numpy(), nprobe, skip=self.nprobe)
        if self.best is None:  # nothing reached yet: below any similarity (the generator's buffer,
            # free while one query widens)
            self.best = g._scratch(len(self.vectors) * n_items).fill_(NOTHING)
        self.best.scatter_reduce_(0, m * n_items + lists.csr()[2][slot], sim, "amax")
        self.nprobe = nprobe
        # max(best, theta): a query token's unreached similarities are imputed its last list's
        approx = torch.maximum(self.best.view(len(self.vectors), n_items), theta[:, None]).sum(0)
        if g._per_query_word:
            approx /= max(1, len(self.vectors))
        return approx, len(slot) + len(self.vectors) * len(lists.centroids)


class PooledGenerator(FaissGenerator):
    """Candidates from one vector per item: the global vectors, or the tokens' mean.

    With ``global-cosine`` and an exact scan the candidates are the exact top-n, and their
    similarities bound everything else.
    """

    name = "pooled"
    per_item = True

    def __init__(self, store: ShardStore, folder: Path, *, source: str, exact_scores: bool = False,
                 writable: bool = True, progress: bool = False) -> None:
        super().__init__(store, folder, writable=writable, progress=progress)
        if source not in ("pooled", "mean"):
            raise ValueError(f"source must be 'pooled' or 'mean', got {source!r}.")
        self.source, self.exact_scores = source, exact_scores

    @property
    def file_stem(self) -> str:
        return "pooled" if self.source == "pooled" else "mean"

    def settings(self) -> dict[str, Any]:
        return {"source": self.source}

    def vectors_of(self, e: Embeddings) -> torch.Tensor:
        if self.source == "pooled":
            return e.pooled.float()
        summed = (e.tokens.float() * e.mask[..., None]).sum(dim=1)
        return F.normalize(summed, dim=-1)

    def item_vectors(self, start: int, e: Embeddings) -> tuple[np.ndarray, np.ndarray]:
        return _finite_rows(self.vectors_of(e), start)

    def propose(self, query: Embeddings, n: int) -> Candidates:
        self.sync()
        sims, ids = self.index.search(self.vectors_of(query).numpy(), n)
        sims, ids = torch.from_numpy(sims), torch.from_numpy(ids)
        rows = [r[r >= 0] for r in ids]
        work = self._scan_work(len(query))
        if not (self.exact and self.exact_scores):
            return Candidates(rows, work=work)
        full = (ids >= 0).all(dim=1) & (ids.shape[1] < len(self.store))
        floor = torch.where(full, sims[:, -1], torch.tensor(-torch.inf))
        return Candidates(rows, [s[r >= 0] for s, r in zip(sims, ids)], floor, work)


class FdeGenerator(FaissGenerator):
    """MUVERA candidates: one fixed encoding per item (:class:`~xmatch.index.fde.FixedEncoder`).

    The side summed over in the score is encoded with per-bucket sums, the other with means; a
    pooler with both sums (Symm) concatenates both encodings.
    """

    name = "fde"
    per_item = True

    def __init__(self, store: ShardStore, folder: Path, interaction: Interaction, side: str, *,
                 reps: int = 8, bits: int = 4, proj: int = 16, writable: bool = True, progress: bool = False) -> None:
        super().__init__(store, folder, writable=writable, progress=progress)
        self.interaction, self.side = interaction, side
        self.params = {"reps": reps, "bits": bits, "proj": proj}
        self.encoder = FixedEncoder(store.shards[0].tokens.shape[2] if store.shards else 1, **self.params)

    def settings(self) -> dict[str, Any]:
        return self.params | {"text_sum": self.interaction.text_sum, "image_sum": self.interaction.image_sum}

    def _dim(self) -> int:
        return self.encoder.output_dim * (int(self.interaction.text_sum) + int(self.interaction.image_sum))

    def _encode(self, e: Embeddings, images: bool) -> torch.Tensor:
        parts = []
        if self.interaction.text_sum:  # texts summed, images averaged
            parts.append(self.encoder.encode(e, "mean" if images else "sum"))
        if self.interaction.image_sum:
            parts.append(self.encoder.encode(e, "sum" if images else "mean"))
        return torch.cat(parts, dim=1)

    def item_vectors(self, start: int, e: Embeddings) -> tuple[np.ndarray, np.ndarray]:
        return _finite_rows(self._encode(e, self.side == "images"), start)

    def propose(self, query: Embeddings, n: int) -> Candidates:
        self.sync()
        _, ids = self.index.search(self._encode(query, self.side != "images").numpy(), n)
        ids = torch.from_numpy(ids)
        return Candidates([r[r >= 0] for r in ids], work=self._scan_work(len(query)))


def _finite_rows(vectors: torch.Tensor, start: int) -> tuple[np.ndarray, np.ndarray]:
    """One vector per item of a block starting at row ``start``, and the items' rows, without
    the vectors that hold NaN or infinity."""
    keep = torch.isfinite(vectors).all(dim=1)
    return vectors[keep].float().numpy(), (torch.arange(start, start + len(vectors))[keep]).numpy()
