"""The papers' evaluation protocols on an (images x captions) score matrix.

``coco-1k``: the 5,000 test images in 5 folds of 1,000 (rows ``[1000 f, 1000 (f+1))`` and
their 5,000 captions), metrics averaged over the folds; ``coco-5k``: all 5,000 at once;
``f30k-1k``: the 1,000 Flickr30k test images at once.
"""

from __future__ import annotations

import copy
import json
import os
from dataclasses import dataclass, field
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from xmatch.eval.metrics import DirectionResult, all_finite, image_to_text, summarize, text_to_image

PROTOCOLS: dict[str, int | None] = {"coco-1k": 1000, "coco-5k": None, "f30k-1k": None, "full": None}


@dataclass
class EvalResult:
    """Figures of one evaluation: per direction R@1/5/10, medr, meanr, NDCG; rsum; per fold."""

    protocol: str
    i2t: dict[str, float]
    t2i: dict[str, float]
    rsum: float
    folds: list[dict[str, Any]] = field(default_factory=list)
    queries: dict[str, np.ndarray] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)

    def table(self) -> str:
        """A readable two-row table."""
        keys = [k for k in self.i2t if k in self.t2i]
        head = f"{self.protocol:10s} " + " ".join(f"{k:>12s}" for k in keys)
        rows = [head]
        for name, figures in (("i2t", self.i2t), ("t2i", self.t2i)):
            rows.append(f"{name:10s} " + " ".join(f"{figures[k]:12.4f}" if "ndcg" in k else f"{figures[k]:12.2f}" for k in keys))
        rows.append(f"{'rsum':10s} {self.rsum:12.2f}")
        return "\n".join(rows)

    @property
    def printed_rsum(self) -> float:
        """The rsum the original ``evalrank`` prints for COCO 1K: 6 x the fold-mean rsum
        (a quirk inherited from VSE++); :attr:`rsum` is the true fold mean."""
        return 6 * self.rsum if self.folds else self.rsum

    def figures(self) -> dict[str, Any]:
        """Every aggregate figure (no per-query arrays), as plain data."""
        return {k: copy.deepcopy(v) for k, v in vars(self).items() if k != "queries"}

    def save_json(self, path: str | os.PathLike, with_queries: bool = False) -> None:
        """Write the figures (and, if asked, the per-query ranks, top-k and NDCG) as JSON."""
        data = self.figures()
        if with_queries:
            data["queries"] = {k: v.tolist() for k, v in self.queries.items()}
        with open(path, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=1)


def _direction_figures(i2t: DirectionResult, t2i: DirectionResult) -> tuple[dict[str, float], dict[str, float], float]:
    a = summarize(i2t, exclude_zero_ndcg=True)
    b = summarize(t2i, exclude_zero_ndcg=False)
    # i2t R@1+5+10 then t2i, added left to right as the original does
    return a, b, a["r1"] + a["r5"] + a["r10"] + b["r1"] + b["r5"] + b["r10"]


def fold_layout(n_images: int, protocol: str, fold_images: int | None = None) -> list[slice]:
    """The image ranges a protocol evaluates separately (one per fold).

    Example:
        >>> fold_layout(5000, "coco-1k")[1]
        slice(1000, 2000, None)
    """
    if protocol not in PROTOCOLS:
        raise ValueError(f"unknown protocol '{protocol}'; choose one of {sorted(PROTOCOLS)}.")
    size = fold_images or PROTOCOLS[protocol] or n_images
    if n_images % size:
        raise ValueError(
            f"{n_images} images do not split into folds of {size} ({protocol}); the COCO 1K "
            "protocol needs the 5,000-image test split (or pass fold_images)."
        )
    return [slice(start, start + size) for start in range(0, n_images, size)]


def _as_scores(block: Any, captions_per_image: int, check_finite: bool = True) -> np.ndarray:
    if hasattr(block, "detach"):
        block = block.detach().float().cpu().numpy()
    block = np.asarray(block)
    if block.ndim != 2 or block.shape[1] != captions_per_image * block.shape[0]:
        raise ValueError(
            f"scores must be [images, {captions_per_image} x images] ({captions_per_image} "
            f"captions per image), got {block.shape}; order the captions image by image or "
            "pass captions_per_image."
        )
    if check_finite and not all_finite(block):
        raise ValueError("scores contain NaN or inf; check the embeddings.")
    return block


def evaluate_blocks(
    blocks: Sequence[Any],
    protocol: str,
    captions_per_image: int = 5,
    relevance: Mapping[str, np.ndarray] | None = None,
) -> EvalResult:
    """Evaluate the per-fold score blocks of a protocol (see :func:`fold_layout`).

    Block f scores the images of fold f against their own captions; ``relevance`` covers the
    whole set (``[cN, N]``) and is read at each fold's diagonal block, as the original does.
    This is what :func:`xmatch.eval.evaluate` uses, so the COCO 1K protocol never computes
    the off-diagonal 80% of the 5K matrix.
    """
    c = captions_per_image
    relevance = dict(relevance or {})
    n_img = sum(np.shape(b)[0] for b in blocks)
    for name, rel in relevance.items():
        if rel.shape != (c * n_img, n_img):
            raise ValueError(
                f"relevance '{name}' is {rel.shape}; expected (captions, images) = {(c * n_img, n_img)}."
            )
    folds, runs, start = [], [], 0
    for block in blocks:
        scores = _as_scores(block, c)
        size = scores.shape[0]
        rel = {k: v[c * start : c * (start + size), start : start + size] for k, v in relevance.items()}
        i2t = image_to_text(scores, c, rel)
        t2i = text_to_image(scores, c, rel)
        a, b, rsum = _direction_figures(i2t, t2i)
        folds.append({"i2t": a, "t2i": b, "rsum": rsum})
        runs.append((start, i2t, t2i))
        start += size
    mean = lambda d: {k: float(np.mean([fold[d][k] for fold in folds])) for k in folds[0][d]}  # noqa: E731
    # per-query outcomes with indices into the whole set, fold after fold
    queries = {
        "i2t_ranks": np.concatenate([i2t.ranks for _, i2t, _ in runs]),
        "t2i_ranks": np.concatenate([t2i.ranks for _, _, t2i in runs]),
        "i2t_top": np.concatenate([i2t.top + c * s for s, i2t, _ in runs]),
        "t2i_top": np.concatenate([t2i.top + s for s, _, t2i in runs]),
    }
    for name in relevance:
        queries[f"i2t_ndcg_{name}"] = np.concatenate([i2t.ndcg[name] for _, i2t, _ in runs])
        queries[f"t2i_ndcg_{name}"] = np.concatenate([t2i.ndcg[name] for _, _, t2i in runs])
    return EvalResult(
        protocol=protocol,
        i2t=mean("i2t"),
        t2i=mean("t2i"),
        rsum=float(np.mean([fold["rsum"] for fold in folds])),
        folds=folds if len(folds) > 1 else [],
        queries=queries,
    )


def evaluate_scores(
    scores: Any,
    protocol: str = "full",
    captions_per_image: int = 5,
    relevance: Mapping[str, np.ndarray] | None = None,
    fold_images: int | None = None,
) -> EvalResult:
    """Evaluate a score matrix ``[N, cN]`` (caption k belongs to image k // c).

    Args:
        scores: numpy array or torch tensor of image x caption scores.
        protocol: ``coco-1k`` (5 folds of 1,000 images, averaged), ``coco-5k``, ``f30k-1k``,
            ``full`` (all images at once).
        relevance: ``{name: [cN, N]}`` caption relevance of each image for NDCG@25
            (``rougel``, ``spice``), the original layout.
        fold_images: images per fold (default: the protocol's, 1,000 for ``coco-1k``).

    Example:
        >>> evaluate_scores(np.eye(2).repeat(5, axis=1)).t2i["r1"]
        100.0
    """
    scores = _as_scores(scores, captions_per_image, check_finite=False)  # each block is checked
    c = captions_per_image
    blocks = [scores[f, c * f.start : c * f.stop] for f in fold_layout(scores.shape[0], protocol, fold_images)]
    return evaluate_blocks(blocks, protocol, captions_per_image, relevance)
