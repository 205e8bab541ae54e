"""Can the grounded verifier learn a world's relations when every object word sits on its exact box?

A test bed for the head alone, without pictures or a matching model, on the ``tabletop`` world's
tables and captions (docs/tabletop.md): each word is a fixed random unit vector (a stand-in for
a frozen model's word tokens), each object a region whose token is the normalised sum of its
kind's, colour's, pattern's and size's word vectors, with its drawn box; background regions
with random boxes and tokens fill each picture to ``--regions``. Every word that names one
object of the picture (the noun, and the colour, pattern and size words before it:
``grounding_accuracy.word_targets``) is grounded one-hot on that object's region, in the
caption's own picture and, in its twin, on the object of the same kind (what the word names
there); the other words ground through the head's own similarity softmax, as in the model.

The head (``GroundedVerifier``, the ``verifier`` recipe's AdamW at 2e-3) is trained on batches
of captions, each with its own picture (positive), its twin and a random picture (negatives),
and scored within the held-out twin groups: how often a caption scores its own picture above
its twin (t2i, chance 50 %), by twin kind and, for relation twins, by pair of relations.

    python benchmarks/verifier_oracle.py                              # 4,000 captions, 1,600 steps
    python benchmarks/verifier_oracle.py --only relation:far/near     # near / far twins alone
    python benchmarks/verifier_oracle.py --only relation --pairs      # relation twins, with a pair readout
    python benchmarks/verifier_oracle.py --only relation --pairs --edges   # ... reading edge gaps too
    python benchmarks/verifier_oracle.py --only relation --one-kind-a-batch   # one pair of relations a batch
    python benchmarks/verifier_oracle.py --only relation:far/near --shift 0.5  # where on the canvas says nothing
    python benchmarks/verifier_oracle.py --only relation --layout     # the head with its layout likelihood

``--pairs`` adds a relation network over the words (Santoro et al., 2017) to the head: every
pair of real words, their reasoned tokens and their referents' relative geometry through an
MLP, pooled by learned attention into the [CLS] token. It is an experiment of this script, not
a head of the library; ``--edges`` gives it the gaps between the boxes' facing edges and the
share of each box inside the other besides the reasoner's relative geometry.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from grounding_accuracy import caption_words, word_targets  # noqa: E402

from xmatch.components.reasoners import BOX_PAIR_FEATURES, EDGE_FEATURES, edge_features, relative_box_features  # noqa: E402
from xmatch.components.verifier_grounded import GroundedVerifier  # noqa: E402
from xmatch.model.embeddings import Embeddings  # noqa: E402
from xmatch.tabletop.captions import captions as draw_captions  # noqa: E402
from xmatch.tabletop.dataset import CAPTION_STREAM, CAPTIONS_PER_IMAGE, sample_tables, stream_rng  # noqa: E402
from xmatch.tabletop.world import Table  # noqa: E402

#: the tabletop's canvas side, which its boxes are in
CANVAS = 224
#: held-out twin groups are numbered from here, far from any training group
TEST_GROUP_START = 100_000
#: the seed of the word vectors and background regions (the world, not the run)
WORLD_SEED = 1234


class Caption(NamedTuple):
    """A caption's words, its picture, its twin picture and the twin kind it is scored under
    (``relation:far/near``: a relation twin, with its two relations)."""

    words: list[str]
    picture: int
    twin: int
    kind: str


def twin_kind(base: Table, twin: Table) -> str:
    """The kind of a twin pair, relation twins with their two relations in alphabetical order.

    Example:
        >>> base, twin = sample_tables(0, 3)
        >>> twin_kind(base, twin) in ("roles", "colour", "pattern", "count") or twin_kind(base, twin).startswith("relation:")
        True
    """
    if twin.variant != "relation":
        return twin.variant
    return "relation:" + "/".join(sorted((base.relation, twin.relation)))


def twin_groups(groups: Sequence[int]) -> tuple[list[list[dict]], list[Caption]]:
    """The pictures (each a list of its objects as dicts) and captions of the twin groups
    ``groups`` of the tabletop world with seed 0, as its sets draw them."""
    pictures: list[list[dict]] = []
    caps: list[Caption] = []
    for group in groups:
        tables = sample_tables(0, group)
        caption_rng = stream_rng(0, group, CAPTION_STREAM)
        first = len(pictures)
        pictures += [[dataclasses.asdict(t) for t in table.things] for table in tables]
        kind = twin_kind(*tables)
        for i, table in enumerate(tables):
            for caption in draw_captions(table, caption_rng, CAPTIONS_PER_IMAGE):
                caps.append(Caption(caption_words(caption), first + i, first + 1 - i, kind))
    return pictures, caps


def referent_in(pictures: list[list[dict]], picture: int, own: int, obj: int) -> int | None:
    """The object of ``picture`` that object ``obj`` of the caption's own picture ``own`` is
    named as: itself in its own picture, the only object of its kind in another (None if none
    or several).

    Example:
        >>> pics = [[{"kind": "cup"}, {"kind": "box"}], [{"kind": "box"}, {"kind": "cup"}]]
        >>> referent_in(pics, 0, 0, 1), referent_in(pics, 1, 0, 1)
        (1, 0)
    """
    if picture == own:
        return obj
    kind = pictures[own][obj]["kind"]
    same = [j for j, t in enumerate(pictures[picture]) if t["kind"] == kind]
    return same[0] if len(same) == 1 else None


def word_vectors(pictures: list[list[dict]], caps: list[Caption], dim: int) -> tuple[dict[str, int], torch.Tensor]:
    """A row index for every word of the captions and of the objects' descriptions, and a fixed
    random unit vector ``[dim]`` for each (the same words in the same order give the same vectors).

    Example:
        >>> vocabulary, vectors = word_vectors([[{"kind": "cup", "colour": "teal", "pattern": "plain", "size": "small"}]],
        ...                                    [Caption(["a", "cup"], 0, 0, "colour")], dim=8)
        >>> list(vocabulary), vectors.shape
        (['a', 'cup', 'teal', 'plain', 'small'], torch.Size([5, 8]))
    """
    vocabulary: dict[str, int] = {}
    for c in caps:
        for w in c.words:
            vocabulary.setdefault(w, len(vocabulary))
    for things in pictures:
        for t in things:
            for w in (t["kind"], t["colour"], t["pattern"], t["size"]):
                vocabulary.setdefault(w, len(vocabulary))
    generator = torch.Generator().manual_seed(WORLD_SEED)
    return vocabulary, F.normalize(torch.randn(len(vocabulary), dim, generator=generator), dim=-1)


class World:
    """Word vectors, pictures as region tokens and boxes, and captions as word tokens."""

    def __init__(self, pictures: list[list[dict]], caps: list[Caption], vocabulary: dict[str, int],
                 vectors: torch.Tensor, regions: int, seed: int, shift: float = 0.0) -> None:
        self.pictures, self.caps = pictures, caps
        dim = vectors.shape[1]
        self.region_tokens = torch.zeros(len(pictures), regions, dim)
        self.boxes = torch.zeros(len(pictures), regions, 4)
        g = torch.Generator().manual_seed(seed)
        for i, things in enumerate(pictures):
            if len(things) > regions:
                raise ValueError(f"a picture holds {len(things)} objects, more than --regions {regions}.")
            for j, t in enumerate(things):
                words = (t["kind"], t["colour"], t["pattern"], t["size"])
                self.region_tokens[i, j] = F.normalize(vectors[[vocabulary[w] for w in words]].sum(0), dim=0)
                self.boxes[i, j] = torch.tensor(t["box"], dtype=torch.float32) / CANVAS
            for j in range(len(things), regions):  # background proposals
                corner = torch.rand(2, generator=g) * 0.7
                size = 0.05 + torch.rand(2, generator=g) * 0.3
                self.boxes[i, j] = torch.cat([corner, (corner + size).clamp(max=1.0)])
                self.region_tokens[i, j] = F.normalize(torch.randn(dim, generator=g), dim=0)
        if shift:
            # one offset for every box of a picture: where things lie on the canvas says nothing
            # any more, where they lie from each other is unchanged
            offsets = (torch.rand(len(pictures), 1, 2, generator=g) * 2 - 1) * shift
            self.boxes += offsets.repeat(1, 1, 2)
        longest = max(len(c.words) for c in caps)
        self.word_tokens = torch.zeros(len(caps), longest, dim)
        self.word_mask = torch.zeros(len(caps), longest, dtype=torch.bool)
        self.targets: list[dict[int, int]] = []
        for k, c in enumerate(caps):
            self.word_tokens[k, : len(c.words)] = vectors[[vocabulary[w] for w in c.words]]
            self.word_mask[k, : len(c.words)] = True
            self.targets.append({p: obj for p, obj, _ in word_targets(c.words, pictures[c.picture])})

    def pairs(self, caption_rows: torch.Tensor, picture_rows: torch.Tensor) -> tuple[Embeddings, Embeddings, torch.Tensor]:
        """The row-aligned (picture, caption) pairs and their forced referents ``[3, F]``
        (pair row, word position, region)."""
        longest = int(self.word_mask[caption_rows].sum(1).max())
        img = Embeddings(self.region_tokens[picture_rows], torch.ones(len(picture_rows), self.boxes.shape[1], dtype=torch.bool),
                         boxes=self.boxes[picture_rows])
        txt = Embeddings(self.word_tokens[caption_rows, :longest], self.word_mask[caption_rows, :longest])
        forced = []
        for row, (k, picture) in enumerate(zip(caption_rows.tolist(), picture_rows.tolist())):
            for position, obj in self.targets[k].items():
                region = referent_in(self.pictures, picture, self.caps[k].picture, obj)
                if region is not None:
                    forced.append((row, position, region))
        return img, txt, torch.tensor(forced, dtype=torch.long).reshape(-1, 3).T


class PairReadout(nn.Module):
    """A relation network over the words: every pair of real words with a box, their tokens
    and their referents' relative geometry (with ``edges``, also :func:`edge_features`)
    through an MLP, pooled by learned attention."""

    def __init__(self, width: int, hidden: int = 16, inner: int = 32, edges: bool = False) -> None:
        super().__init__()
        self.edges = edges
        features = BOX_PAIR_FEATURES + (EDGE_FEATURES if edges else 0)
        self.geometry = nn.Sequential(nn.Linear(features, hidden), nn.ReLU(), nn.Linear(hidden, inner))
        self.left, self.right = nn.Linear(width, inner), nn.Linear(width, inner)
        self.mlp = nn.Sequential(nn.ReLU(), nn.Linear(inner, inner), nn.ReLU())
        self.score, self.out = nn.Linear(inner, 1), nn.Linear(inner, width)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, boxes: torch.Tensor) -> torch.Tensor:
        """``x [n, W, width]``, ``mask [n, W]``, ``boxes [n, W, 4]`` -> ``[n, width]``."""
        has_box = mask & (boxes != 0).any(-1)
        pairs = has_box[:, :, None] & has_box[:, None, :]
        geometry = relative_box_features(boxes)
        if self.edges:
            geometry = torch.cat([geometry, edge_features(boxes)], dim=-1)
        z = self.left(x)[:, :, None] + self.right(x)[:, None, :] + self.geometry(geometry)
        z = self.mlp(z)
        scores = self.score(z).squeeze(-1).masked_fill(~pairs, float("-inf"))
        weights = scores.flatten(1).softmax(-1).nan_to_num(0.0).view_as(scores)
        return self.out(torch.einsum("nij,nijk->nk", weights, z))


class OracleGroundedVerifier(GroundedVerifier):
    """``GroundedVerifier`` whose grounding puts the words of ``forced`` (``[3, F]``: pair row,
    word position, region) one-hot on their region; with ``pairs`` a :class:`PairReadout` adds
    to the [CLS] token after the reasoner."""

    def __init__(self, dim: int, pairs: bool = False, edges: bool = False, layout: bool = False) -> None:
        super().__init__(dim=dim, layout=layout)
        self.forced: torch.Tensor | None = None
        if pairs:
            self.reasoner = _WithPairs(self.reasoner, PairReadout(self.width, edges=edges))

    def ground(self, img: Embeddings, txt: Embeddings) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        weights, similarity, usable = super().ground(img, txt)
        if self.forced is not None and self.forced.numel():
            row, position, region = self.forced
            weights = weights.clone()
            weights[row, position] = 0.0
            weights[row, position, region] = 1.0
        return weights, similarity, usable


class _WithPairs(nn.Module):
    def __init__(self, reasoner: nn.Module, readout: PairReadout) -> None:
        super().__init__()
        self.reasoner, self.readout = reasoner, readout

    def forward(self, x: torch.Tensor, mask: torch.Tensor, boxes: torch.Tensor) -> torch.Tensor:
        y = self.reasoner(x, mask, boxes)
        cls = y[:, :1] + self.readout(y[:, 1:], mask[:, 1:], boxes[:, 1:]).unsqueeze(1)
        return torch.cat([cls, y[:, 1:]], dim=1)


def scored(head: OracleGroundedVerifier, world: World, caption_rows: torch.Tensor,
           picture_rows: torch.Tensor) -> tuple[torch.Tensor, tuple[torch.Tensor, str] | None]:
    """The head's logits of the (caption, picture) rows and its own training term, if any."""
    img, txt, head.forced = world.pairs(caption_rows, picture_rows)
    try:
        return head.score_pairs(img, txt)
    finally:
        head.forced = None


def logits(head: OracleGroundedVerifier, world: World, caption_rows: torch.Tensor, picture_rows: torch.Tensor) -> torch.Tensor:
    return scored(head, world, caption_rows, picture_rows)[0]


@torch.no_grad()
def twin_accuracy(head: OracleGroundedVerifier, world: World, chunk: int = 512) -> dict[str, float]:
    """t2i within the twin groups, percent, by kind (``relation``: all relation twins)."""
    head.eval()
    wins: dict[str, list[bool]] = defaultdict(list)
    for start in range(0, len(world.caps), chunk):
        rows = torch.arange(start, min(start + chunk, len(world.caps)))
        own = torch.tensor([world.caps[k].picture for k in rows.tolist()])
        twin = torch.tensor([world.caps[k].twin for k in rows.tolist()])
        won = (logits(head, world, rows, own) > logits(head, world, rows, twin)).tolist()
        for k, ok in zip(rows.tolist(), won):
            kind = world.caps[k].kind
            wins[kind].append(ok)
            if kind.startswith("relation:"):
                wins["relation"].append(ok)
    head.train()
    return {kind: 100.0 * float(np.mean(v)) for kind, v in sorted(wins.items())}


def train(args: argparse.Namespace) -> None:
    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    started = time.perf_counter()
    train_pictures, train_caps = twin_groups(range(args.train_groups))
    test_pictures, test_caps = twin_groups(range(TEST_GROUP_START, TEST_GROUP_START + args.test_groups))
    if args.only:
        train_caps = [c for c in train_caps if c.kind.startswith(args.only)]
        if not train_caps:
            raise SystemExit(f"no training caption of a twin kind starting with {args.only!r}.")
    vocabulary, vectors = word_vectors(train_pictures + test_pictures, train_caps + test_caps, args.dim)
    train_world = World(train_pictures, train_caps, vocabulary, vectors, args.regions, WORLD_SEED, args.shift)
    test_world = World(test_pictures, test_caps, vocabulary, vectors, args.regions, WORLD_SEED + 1, args.shift)
    kinds = np.array([c.kind for c in train_caps])
    relational = np.flatnonzero(np.char.startswith(kinds.astype(str), "relation") | (kinds == "roles"))
    print(f"{len(train_caps)} training captions ({len(relational)} of relation or roles twins), {len(test_caps)} test "
          f"captions; head {'with a pair readout' + (' and edge features' if args.edges else '') if args.pairs else 'without a pair readout'}{', with its layout likelihood' if args.layout else ''}; seed {args.seed}; "
          f"{torch.get_num_threads()} thread(s), load average {os.getloadavg()[0]:.2f}; data {time.perf_counter() - started:.0f} s",
          flush=True)
    head = OracleGroundedVerifier(dim=args.dim, pairs=args.pairs, edges=args.edges, layout=args.layout)
    optimizer = torch.optim.AdamW(head.parameters(), lr=args.lr)
    labels = torch.cat([torch.ones(args.batch), torch.zeros(2 * args.batch)])
    started = time.perf_counter()
    by_kind = {kind: np.flatnonzero(kinds == kind) for kind in sorted(set(kinds.tolist()))}
    for step in range(1, args.steps + 1):
        if args.one_kind_a_batch:
            # every caption of the batch from one twin kind (one pair of relations), the kind drawn each step
            kind = list(by_kind)[int(rng.integers(len(by_kind)))]
            rows = rng.choice(by_kind[kind], args.batch)
        else:
            relation_rows = int(args.batch * args.relation_share) if len(relational) else 0
            rows = np.concatenate([rng.choice(relational, relation_rows) if relation_rows else np.zeros(0, np.int64),
                                   rng.integers(0, len(train_caps), args.batch - relation_rows)])
        rows = torch.as_tensor(rows)
        own = torch.tensor([train_caps[k].picture for k in rows.tolist()])
        twin = torch.tensor([train_caps[k].twin for k in rows.tolist()])
        other = torch.as_tensor(rng.integers(0, len(train_pictures), args.batch))
        out, extra = scored(head, train_world, rows.repeat(3), torch.cat([own, twin, other]))
        # the positive weighs as much as its two negatives together
        loss = F.binary_cross_entropy_with_logits(out, labels, pos_weight=torch.tensor(2.0))
        if extra is not None:  # the layout's likelihood, on the positives (the first third)
            loss = loss + extra[0][: args.batch].mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if step % args.eval_every == 0 or step == args.steps:
            accuracy = twin_accuracy(head, test_world)
            shown = ", ".join(f"{kind} {value:.1f}" for kind, value in accuracy.items())
            print(f"step {step:5d}  loss {loss.item():.3f}  {time.perf_counter() - started:6.0f} s  t2i within twins: {shown}",
                  flush=True)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--train-groups", type=int, default=400, help="twin groups to train on (10 captions each)")
    parser.add_argument("--test-groups", type=int, default=500, help="held-out twin groups")
    parser.add_argument("--only", default=None, metavar="KIND",
                        help="train on the captions of twin kinds starting with KIND only (relation, relation:far/near, colour...)")
    parser.add_argument("--relation-share", type=float, default=0.0,
                        help="share of each batch drawn from relation and roles twins (the rest at random)")
    parser.add_argument("--one-kind-a-batch", action="store_true",
                        help="fill each batch with the captions of one twin kind (relation twins: one pair of relations), "
                             "the kind drawn at random each step")
    parser.add_argument("--pairs", action="store_true", help="add the pair readout (a relation network) to the head")
    parser.add_argument("--edges", action="store_true", help="with --pairs: the pair readout also reads edge gaps and containment")
    parser.add_argument("--layout", action="store_true",
                        help="the head also scores the caption's layout likelihood (GroundedVerifier(layout=True))")
    parser.add_argument("--shift", type=float, default=0.0, metavar="S",
                        help="move every box of a picture by one random offset of up to S (in picture sides) along "
                             "each axis: positions on the canvas then say nothing, positions relative to each other "
                             "are kept")
    parser.add_argument("--steps", type=int, default=1600)
    parser.add_argument("--batch", type=int, default=64, help="captions a step (each with 3 pictures)")
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--dim", type=int, default=64, help="width of the word and region tokens")
    parser.add_argument("--regions", type=int, default=16, help="regions a picture (objects, then background)")
    parser.add_argument("--eval-every", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.edges and not args.pairs:
        parser.error("--edges is a setting of the pair readout: add --pairs.")
    if not 0.0 <= args.relation_share <= 1.0:
        parser.error(f"--relation-share must be in [0, 1], got {args.relation_share}.")
    train(args)


if __name__ == "__main__":
    main()
