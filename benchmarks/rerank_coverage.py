"""How often a model's first stage puts a caption's own image, and both twins of its group,
among its top K over a whole split: what bounds ``--rerank K`` on hard-negative groups.

A verifier re-ranks only what the pooler put first. On the scenes ``groups`` split (1,920
images, 960 twin pairs) a caption whose own image is not in its top K is lost whatever the
verifier says; one whose twin is not there is won. This prints, per kind of twin and K, the
share of captions whose own image is in the pooler's top K and the share whose own image and
twin both are.

    python benchmarks/rerank_coverage.py teran-mrsw-hn-scenes --ks 1,5,10,20,50,100 --json coverage.json
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import torch

import xmatch
from xmatch.data import open_dataset
from xmatch.eval import encode_dataset, fold_layout, score_blocks


def coverage(scores: np.ndarray, caption_image: np.ndarray, groups, ks: list[int]) -> dict[int, dict[str, dict[str, float]]]:
    """``{K: {kind: {"own": share, "both": share}}}`` from the pooler's ``[images, captions]``
    scores, for groups of two images (the scenes twins)."""
    twin, kind = {}, {}
    for group in groups.groups:
        a, b = group.images
        twin[a], twin[b] = b, a
        kind[a] = kind[b] = group.kind
    columns = np.arange(scores.shape[1])
    order = np.argsort(-scores, axis=0, kind="stable")
    rank = np.empty_like(order)
    rank[order, columns[None, :]] = np.arange(scores.shape[0])[:, None]
    own = rank[caption_image, columns]
    other = rank[np.array([twin[i] for i in caption_image]), columns]
    kinds = np.array([kind[i] for i in caption_image])
    out: dict[int, dict[str, dict[str, float]]] = {}
    for k in ks:
        out[k] = {}
        for name in sorted(set(kinds)):
            chosen = kinds == name
            out[k][name] = {"own": float((own[chosen] < k).mean()), "both": float(((own[chosen] < k) & (other[chosen] < k)).mean())}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", help="zoo name or local-dir:DIR (pretrained weights)")
    parser.add_argument("--data", help="scenes cache folder (default: the cache)")
    parser.add_argument("--ks", default="1,5,10,20,50,100", help="comma-separated K")
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args()
    model = xmatch.build(args.model, pretrained=True).eval()
    split = open_dataset("scenes", args.data, split="groups", progress=False)
    with torch.inference_mode():
        encoded = encode_dataset(model, split, progress=False)
        layout = fold_layout(len(split.captions) // split.captions_per_image, "full")
        scores = score_blocks(model, encoded, layout, split.captions_per_image, progress=False)[0]
    figures = coverage(np.asarray(scores), np.asarray(split.caption_image), split.hard_negative_groups(),
                       [int(k) for k in args.ks.split(",")])
    print("K      " + "  ".join(f"{kind:>16s}" for kind in figures[next(iter(figures))]) + "   (own in top K / both twins)")
    for k, row in figures.items():
        print(f"{k:<6d} " + "  ".join(f"{100 * v['own']:7.1f} / {100 * v['both']:5.1f}" for v in row.values()))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(figures, f, indent=1)


if __name__ == "__main__":
    main()
