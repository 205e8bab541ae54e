"""How often a model's first stage puts a caption's own image, and both twins of its group,
among its top K over a whole split: what bounds ``--rerank K`` on hard-negative groups.

A verifier re-ranks only what the pooler put first. On the scenes ``groups`` split (1,920
images, 960 twin pairs) a caption whose own image is not in its top K is lost whatever the
verifier says; one whose twin is not there is won. This prints, per kind of twin and K, the
share of captions whose own image is in the pooler's top K, the share whose own image and
twin both are, and the t2i figure a perfect verifier would reach on those lists; with
``--neighbours M`` each list is widened as ``xmatch eval --rerank K --rerank-neighbours M`` widens it.

    python benchmarks/rerank_coverage.py teran-mrsw-hn-scenes --ks 1,5,10,20,50,100 --json coverage.json
    python benchmarks/rerank_coverage.py teran-mrsw-hn-scenes --ks 10,20,30,50,100 --neighbours 1
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import torch

import xmatch
from xmatch.data import open_dataset
from xmatch.eval import encode_dataset, fold_layout, score_blocks
from xmatch.model.rerank import TWIN_WEIGHT


def coverage(
    scores: np.ndarray, caption_image: np.ndarray, groups, ks: list[int], near: np.ndarray | None = None
) -> dict[int, dict[str, dict[str, float]]]:
    """``{K: {kind: {"own", "both", "ceiling", "list"}}}`` from the pooler's ``[images, captions]``
    scores, for groups of two images (the scenes twins): the share of captions whose own image
    is in the list, whose own image and twin both are, the t2i figure a verifier that always
    prefers the own image would reach (own in the list: won; only the twin: lost; neither: the
    pooler's order), and the mean list length. ``near`` (``[images, m]``, the rows of
    ``model.image_neighbours``) widens each list with the neighbours of its top K, as
    ``--rerank-neighbours m`` does (the top K drawn as it draws them; the t2i lists alone, without
    the images' lists that ``--rerank`` also verifies)."""
    twin, kind = {}, {}
    for group in groups.groups:
        a, b = group.images
        twin[a], twin[b] = b, a
        kind[a] = kind[b] = group.kind
    columns = np.arange(scores.shape[1])
    # with neighbours the top K are drawn as rerank_scores draws them: each image's score plus
    # TWIN_WEIGHT times its nearest image's
    ranking = scores if near is None else scores + TWIN_WEIGHT * scores[near[:, 0]]
    order = np.argsort(-ranking, axis=0, kind="stable")
    rank = np.empty_like(order)
    rank[order, columns[None, :]] = np.arange(scores.shape[0])[:, None]
    twins = np.array([twin[i] for i in caption_image])
    # an image enters a caption's list at its own rank or at the best rank of an image it neighbours
    listed_at = rank.copy()
    if near is not None:
        for image, neighbours in enumerate(near):
            for n in neighbours:
                listed_at[n] = np.minimum(listed_at[n], rank[image])
    own, other = listed_at[caption_image, columns], listed_at[twins, columns]
    pooler_wins = scores[caption_image, columns] > scores[twins, columns]
    kinds = np.array([kind[i] for i in caption_image])
    out: dict[int, dict[str, dict[str, float]]] = {}
    for k in ks:
        length = k if near is None else float(np.mean([len(np.union1d(c, near[c])) for c in order[:k].T]))
        won = np.where(own < k, True, np.where(other < k, False, pooler_wins))
        out[k] = {}
        for name in sorted(set(kinds)):
            chosen = kinds == name
            out[k][name] = {"own": float((own[chosen] < k).mean()), "both": float(((own[chosen] < k) & (other[chosen] < k)).mean()),
                            "ceiling": float(won[chosen].mean()), "list": length}
    return out


def twin_nearest(near: np.ndarray, groups) -> dict[str, float]:
    """Per kind, the share of twin images whose twin is their first neighbour in ``near``."""
    hits: dict[str, list[bool]] = {}
    for group in groups.groups:
        a, b = group.images
        hits.setdefault(group.kind, []).extend([near[a][0] == b, near[b][0] == a])
    return {kind: float(np.mean(v)) for kind, v in sorted(hits.items())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", help="zoo name or local-dir:DIR (pretrained weights)")
    parser.add_argument("--data", help="scenes cache folder (default: the cache)")
    parser.add_argument("--ks", default="1,5,10,20,50,100", help="comma-separated K")
    parser.add_argument("--neighbours", type=int, default=0,
                        help="widen each list with the M nearest images of its top K (as --rerank-neighbours M)")
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args()
    model = xmatch.build(args.model, pretrained=True).eval()
    split = open_dataset("scenes", args.data, split="groups", progress=False)
    with torch.inference_mode():
        encoded = encode_dataset(model, split, progress=False)
        layout = fold_layout(len(split.captions) // split.captions_per_image, "full")
        scores = score_blocks(model, encoded, layout, split.captions_per_image, progress=False)[0]
        near = model.image_neighbours(encoded.images, args.neighbours).numpy() if args.neighbours else None
    groups = split.hard_negative_groups()
    figures = coverage(np.asarray(scores), np.asarray(split.caption_image), groups, [int(k) for k in args.ks.split(",")], near)
    if near is not None:
        print("twin nearest (each image's twin is its nearest image): " + ", ".join(
            f"{kind} {100 * share:.1f} %" for kind, share in twin_nearest(near, groups).items()))
    print("K      list  " + "  ".join(f"{kind:>24s}" for kind in figures[next(iter(figures))])
          + "   (own in the list / both twins / t2i ceiling)")
    for k, row in figures.items():
        length = next(iter(row.values()))["list"]
        print(f"{k:<6d} {length:5.1f} " + "  ".join(f"{100 * v['own']:7.1f} / {100 * v['both']:5.1f} / {100 * v['ceiling']:5.1f}"
                                                 for v in row.values()))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(figures, f, indent=1)


if __name__ == "__main__":
    main()
