"""A synthetic corpus of region sets with planted near-duplicates, for search benchmarks and tests.

Real region embeddings cluster around visual concepts, and many images share a concept, so a
realistic corpus is not a cloud of random vectors (where any query finds its image trivially).
Here every region is a noisy copy of one of ``concepts`` unit centres drawn with a Zipf-like
frequency; each planted group is a base image and ``group_size - 1`` near-duplicates (the same
regions re-noised, a few swapped for others). A query is a caption-like word set made from
``words`` regions of a group's base image, re-noised: its exact top results are that group,
known in advance, and the rest of the ranking is decided by shared popular concepts.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from xmatch.model.embeddings import Embeddings
from xmatch.model.model import MatchingModel


@dataclass(frozen=True)
class PlantedCorpus:
    """The recipe of a planted corpus (everything is derived from ``seed``).

    Attributes:
        images: corpus size.
        regions: tokens per image.
        dim: token width.
        concepts: concept centres.
        groups: planted groups (base + near-duplicates), placed at the start of the corpus
            spread one every ``images // groups`` rows.
        group_size: images per group.
        words: tokens per query.
        noise: norm of the noise added to a concept centre (before re-normalising).

    Example:
        >>> corpus = PlantedCorpus(images=64, regions=6, dim=16, concepts=32, groups=4)
        >>> sum(len(e) for _, e in corpus.batches(16))
        64
    """

    images: int = 100_000
    regions: int = 36
    dim: int = 256
    concepts: int = 4096
    groups: int = 200
    group_size: int = 10
    words: int = 10
    noise: float = 0.7
    swapped: int = 4
    seed: int = 0

    def _centres(self) -> torch.Tensor:
        g = torch.Generator().manual_seed(self.seed)
        return F.normalize(torch.randn(self.concepts, self.dim, generator=g), dim=-1)

    def _noisy(self, base: torch.Tensor, scale: float, g: torch.Generator) -> torch.Tensor:
        noise = F.normalize(torch.randn(base.shape, generator=g), dim=-1) * scale
        return F.normalize(base + noise, dim=-1)

    def _concept_ids(self, shape: tuple[int, ...], g: torch.Generator) -> torch.Tensor:
        # Zipf-like popularity: concept c drawn with weight 1 / (c + 10)
        weights = 1.0 / (torch.arange(self.concepts, dtype=torch.float64) + 10)
        return torch.multinomial(weights, int(torch.tensor(shape).prod()), replacement=True, generator=g).view(shape)

    def group_rows(self) -> torch.Tensor:
        """``[groups, group_size]`` rows of each planted group (the base first)."""
        stride = self.images // self.groups
        if stride < self.group_size:
            raise ValueError(f"{self.groups} groups of {self.group_size} do not fit in {self.images} images.")
        return torch.arange(self.groups)[:, None] * stride + torch.arange(self.group_size)[None]

    def _group_bases(self) -> torch.Tensor:
        """The concept ids of each group's base image ``[groups, regions]``."""
        g = torch.Generator().manual_seed(self.seed + 1)
        return self._concept_ids((self.groups, self.regions), g)

    def batches(self, size: int = 1024) -> Iterator[tuple[list[str], Embeddings]]:
        """``(ids, Embeddings)`` of consecutive images, ``size`` at a time (deterministic); each
        image's global vector is the mean of its tokens, normalised."""
        centres, bases = self._centres(), self._group_bases()
        rows = self.group_rows()
        member = torch.full((self.images,), -1, dtype=torch.long)
        member[rows.flatten()] = torch.arange(self.groups).repeat_interleave(self.group_size)
        for start in range(0, self.images, size):
            stop = min(start + size, self.images)
            g = torch.Generator().manual_seed(self.seed * 1_000_003 + start + 2)
            ids = self._concept_ids((stop - start, self.regions), g)
            group = member[start:stop]
            grouped = group >= 0
            if bool(grouped.any()):
                which = group[grouped]
                planted = bases[which].clone()
                swap = torch.rand(planted.shape, generator=g).argsort(dim=1)[:, : self.swapped]
                planted.scatter_(1, swap, self._concept_ids(tuple(swap.shape), g))
                is_base = rows[which, 0] == torch.arange(start, stop)[grouped]
                planted[is_base] = bases[which[is_base]]  # the base keeps every concept
                ids[grouped] = planted
            tokens = self._noisy(centres[ids], self.noise, g)
            # a global vector per image, as the scoring model's image encoder makes one (its CLS slot)
            pooled = F.normalize(tokens.mean(dim=1), dim=-1)
            mask = torch.ones(stop - start, self.regions, dtype=torch.bool)
            yield [str(i) for i in range(start, stop)], Embeddings(tokens, mask, pooled)

    def queries(self, n: int | None = None) -> tuple[Embeddings, torch.Tensor]:
        """``(query word sets, planted rows [n, group_size])`` for the first ``n`` groups."""
        n = self.groups if n is None else n
        g = torch.Generator().manual_seed(self.seed + 7)
        centres, bases = self._centres(), self._group_bases()[:n]
        words = min(self.words, self.regions)
        pick = torch.rand(n, self.regions, generator=g).argsort(dim=1)[:, :words]
        concept = torch.gather(bases, 1, pick)
        # a word is nearer its concept than a region is (half the noise): captions name concepts
        tokens = self._noisy(centres[concept], self.noise / 2, g)
        return Embeddings(tokens, torch.ones(n, words, dtype=torch.bool)), self.group_rows()[:n]


    def random_queries(self, n: int, seed: int = 11, popular: bool = True) -> Embeddings:
        """``n`` word sets of random concepts, noised as the planted queries are: no planted group
        answers them, so their exact top-10 is decided by near-ties (the hard queries of
        docs/search.md). ``popular``: concepts drawn with the corpus's Zipf-like popularity
        (images share a few of them); else uniformly (mostly rare concepts: the top-10 is decided
        by how close unrelated regions happen to lie).

        Example:
            >>> PlantedCorpus(images=64, regions=6, dim=16, concepts=32, groups=4).random_queries(3).tokens.shape
            torch.Size([3, 6, 16])
        """
        g = torch.Generator().manual_seed(self.seed + seed)
        shape = (n, min(self.words, self.regions))
        concept = self._concept_ids(shape, g) if popular else torch.randint(0, self.concepts, shape, generator=g)
        tokens = self._noisy(self._centres()[concept], self.noise / 2, g)
        return Embeddings(tokens, torch.ones(shape, dtype=torch.bool))


def scoring_model(pooler: str = "MrSw", dim: int = 256, verifier: str | None = None) -> MatchingModel:
    """A small random model of width ``dim`` whose pooler scores token sets made elsewhere
    (the synthetic corpus): an index needs a model, and only its pooler is used here (and its
    verifier head, a registered ``verifier`` with its default sizes, for re-ranking).

    Example:
        >>> scoring_model("Symm", 16).pooler
        SymmPooler()
        >>> type(scoring_model("MrSw", 16, verifier="cross-attention").verifier).__name__
        'CrossAttentionVerifier'
    """
    from xmatch.model.factory import build

    torch.manual_seed(0)  # the same weights, hence the same fingerprint, every time
    head = {"verifier": {"name": verifier}} if verifier is not None else {}
    return build(head | {
        "embed_dim": dim,
        "image_encoder": {"name": "bottomup", "feature_dim": dim, "layers": 0, "box_hidden_dim": 16},
        "text_encoder": {"name": "bigru", "vocab": "zoo:weights/teran-mrsw-scenes/vocab.json",
                         "word_dim": 16, "hidden_dim": 8},
        "image_reasoner": {"name": "identity"},
        "text_reasoner": {"name": "identity"},
        "pooler": {"name": pooler},
        "loss": {"name": "hinge"},
    }).eval()
