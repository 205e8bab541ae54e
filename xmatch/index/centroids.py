"""PLAID-style centroid lists over stored tokens (Santhanam et al., "PLAID: An Efficient Engine
for Late Interaction Retrieval", CIKM 2022).

Every stored token is assigned to its nearest of ``C`` centroids (spherical k-means, FAISS).
A query token visits the lists of its ``nprobe`` nearest centroids (a FAISS search over the
centroids) and every token found there is scored by its centroid's similarity to the query
token ("centroid interaction"): no vector is stored per token, only a 4-byte list number, and
a popular concept's tokens are all reached (a top-k token search would see only k of them).
A token in no visited list is imputed the ``nprobe``-th centroid similarity.

Costs: building assigns every token to a centroid (``tokens x C x dim`` multiply-adds);
a query scores ``nprobe`` lists per query token.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch

from xmatch.index.errors import DamagedIndexError


def list_count(n_tokens: int) -> int:
    """Centroids for ``n_tokens`` stored tokens: the power of two nearest ``sqrt(n_tokens)``
    (lists of ~sqrt(n) tokens, FAISS's rule of thumb), 256 to 65,536."""
    return int(min(65536, max(256, 2 ** round(np.log2(max(n_tokens, 1) ** 0.5)))))


class CentroidLists:
    """Tokens grouped by nearest centroid.

    Args:
        centroids: ``[C, D]`` unit centroids.
        codes: ``[n_tokens]`` int32 list number of each stored token (in row order).
        owners: ``[n_tokens]`` int64 row of each stored token.

    Example:
        >>> lists = CentroidLists.train(np.random.rand(5000, 8).astype("float32"), 16)
        >>> lists.centroids.shape
        (16, 8)
    """

    def __init__(self, centroids: np.ndarray, codes: np.ndarray, owners: np.ndarray) -> None:
        self.centroids = np.ascontiguousarray(centroids, dtype=np.float32)
        self.codes, self.owners = codes.astype(np.int32), owners.astype(np.int64)
        self._quantizer = None
        self._csr: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None

    @classmethod
    def train(cls, sample: np.ndarray, n_lists: int, seed: int = 0) -> CentroidLists:
        """Spherical k-means on a sample of the tokens (no token assigned yet)."""
        from xmatch.index.ann import faiss

        kmeans = faiss().Kmeans(sample.shape[1], n_lists, niter=20, seed=seed, spherical=True,
                                max_points_per_centroid=64, verbose=False)
        kmeans.train(np.ascontiguousarray(sample, dtype=np.float32))
        return cls(kmeans.centroids, np.zeros(0, np.int32), np.zeros(0, np.int64))

    @property
    def quantizer(self):
        if self._quantizer is None:
            from xmatch.index.ann import faiss

            self._quantizer = faiss().IndexFlatIP(self.centroids.shape[1])
            self._quantizer.add(self.centroids)
        return self._quantizer

    def add(self, vectors: np.ndarray, owners: np.ndarray) -> None:
        """Assign tokens (in row order, after every token already added) to their lists."""
        _, nearest = self.quantizer.search(np.ascontiguousarray(vectors, dtype=np.float32), 1)
        self.codes = np.concatenate([self.codes, nearest[:, 0].astype(np.int32)])
        self.owners = np.concatenate([self.owners, owners.astype(np.int64)])
        self._csr = None

    @property
    def ntotal(self) -> int:
        return len(self.codes)

    def csr(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(token positions sorted by list, list offsets [C + 1], owners sorted by list)``."""
        if self._csr is None:
            codes = torch.from_numpy(self.codes).long()
            order = torch.argsort(codes, stable=True)
            offsets = torch.zeros(len(self.centroids) + 1, dtype=torch.long)
            offsets[1:] = torch.bincount(codes, minlength=len(self.centroids)).cumsum(0)
            self._csr = (order, offsets, torch.from_numpy(self.owners)[order])
        return self._csr

    def probe(self, vectors: np.ndarray, nprobe: int, skip: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Visit the ``nprobe`` nearest lists of each query vector (less the ``skip`` nearest,
        visited before).

        Returns:
            ``(query vector of each visit, visited slot in list order, similarity, imputed
            value per query vector)``: every token in a visited list, scored by its centroid's
            similarity; :meth:`csr` maps a slot to its token (``order``) and owner. The imputed
            value is the ``nprobe``-th similarity: no list left unvisited is nearer.

        Example:
            >>> lists = CentroidLists.train(np.random.rand(5000, 8).astype("float32"), 16)
            >>> lists.add(np.random.rand(100, 8).astype("float32"), np.arange(100))
            >>> query, slot, sim, imputed = lists.probe(np.random.rand(2, 8).astype("float32"), 16)
            >>> len(slot), bool((sim >= imputed[query]).all())  # every token, each above its imputed value
            (200, True)
        """
        nprobe = min(nprobe, len(self.centroids))
        sims, lists = self.quantizer.search(np.ascontiguousarray(vectors, dtype=np.float32), nprobe)
        sims, lists = torch.from_numpy(sims), torch.from_numpy(lists).long()
        _, offsets, _ = self.csr()
        visited, lists = sims[:, skip:].flatten(), lists[:, skip:].flatten()
        starts, lengths = offsets[lists], offsets[lists + 1] - offsets[lists]
        total = int(lengths.sum())
        # the slots of a visit are consecutive: its list's start, shifted by where the visit begins
        shift = torch.repeat_interleave(starts - (torch.cumsum(lengths, 0) - lengths), lengths, output_size=total)
        query = torch.arange(len(vectors)).repeat_interleave(nprobe - min(skip, nprobe))
        return (torch.repeat_interleave(query, lengths, output_size=total), shift + torch.arange(total),
                torch.repeat_interleave(visited, lengths, output_size=total), sims[:, -1])

    def save(self, path: Path, items: int) -> None:
        tmp = path.with_name(path.name + ".partial")
        with open(tmp, "wb") as f:
            np.savez(f, centroids=self.centroids, codes=self.codes, owners=self.owners, items=np.array(items))
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: Path) -> tuple[CentroidLists, int] | None:
        if not path.is_file():
            return None
        try:
            with np.load(path) as data:
                lists = cls(data["centroids"], data["codes"], data["owners"])
                items = int(data["items"])
        except (OSError, ValueError, KeyError) as exc:
            raise DamagedIndexError(
                f"stage-1 index {path} is unreadable ({exc}); delete it and it is rebuilt from the shards."
            ) from None
        return lists, items
