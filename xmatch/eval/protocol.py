"""The papers' evaluation protocols on an (images x captions) score matrix.

``coco-1k``: the 5,000 test images in 5 folds of 1,000 (rows ``[1000 f, 1000 (f+1))`` and
their 5,000 captions), metrics averaged over the folds; ``coco-5k``: all 5,000 at once;
``f30k-1k``: the 1,000 Flickr30k test images at once.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from xmatch.eval.metrics import DirectionResult, image_to_text, summarize, text_to_image

PROTOCOLS: dict[str, int | None] = {"coco-1k": 1000, "coco-5k": None, "f30k-1k": None, "full": None}


@dataclass
class EvalResult:
    """Figures of one evaluation: per direction R@1/5/10, medr, meanr, NDCG; rsum; per fold."""

    protocol: str
    i2t: dict[str, float]
    t2i: dict[str, float]
    rsum: float
    folds: list[dict[str, Any]] = field(default_factory=list)
    queries: dict[str, list] = field(default_factory=dict)

    def table(self) -> str:
        """A readable two-row table."""
        keys = [k for k in self.i2t if k in self.t2i]
        head = f"{self.protocol:10s} " + " ".join(f"{k:>12s}" for k in keys)
        rows = [head]
        for name, figures in (("i2t", self.i2t), ("t2i", self.t2i)):
            rows.append(f"{name:10s} " + " ".join(f"{figures[k]:12.4f}" if "ndcg" in k else f"{figures[k]:12.2f}" for k in keys))
        rows.append(f"{'rsum':10s} {self.rsum:12.2f}")
        return "\n".join(rows)

    def save_json(self, path: str | os.PathLike) -> None:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(asdict(self), f, indent=1)


def _direction_figures(i2t: DirectionResult, t2i: DirectionResult) -> tuple[dict[str, float], dict[str, float], float]:
    a = summarize(i2t, exclude_zero_ndcg=True)
    b = summarize(t2i, exclude_zero_ndcg=False)
    return a, b, sum(a[f"r{k}"] + b[f"r{k}"] for k in (1, 5, 10))


def evaluate_scores(
    scores: Any,
    protocol: str = "full",
    captions_per_image: int = 5,
    relevance: dict[str, np.ndarray] | None = None,
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
    if protocol not in PROTOCOLS:
        raise ValueError(f"unknown protocol '{protocol}'; choose one of {sorted(PROTOCOLS)}.")
    if hasattr(scores, "detach"):
        scores = scores.detach().float().cpu().numpy()
    scores = np.asarray(scores)
    if scores.ndim != 2 or scores.shape[1] != captions_per_image * scores.shape[0]:
        raise ValueError(
            f"scores must be [images, {captions_per_image} x images], got {scores.shape}; "
            "order the captions image by image."
        )
    if not np.isfinite(scores).all():
        raise ValueError("scores contain NaN or inf; check the embeddings.")
    relevance = relevance or {}
    for name, rel in relevance.items():
        if rel.shape != scores.T.shape:
            raise ValueError(f"relevance '{name}' is {rel.shape}; expected (captions, images) = {scores.T.shape}.")
    n_img = scores.shape[0]
    size = fold_images or PROTOCOLS[protocol] or n_img
    if n_img % size:
        raise ValueError(f"{n_img} images do not split into folds of {size}.")
    c = captions_per_image
    folds = []
    for f in range(n_img // size):
        img, cap = slice(size * f, size * (f + 1)), slice(c * size * f, c * size * (f + 1))
        block = {k: v[cap, img] for k, v in relevance.items()}
        i2t = image_to_text(scores[img, cap], c, block)
        t2i = text_to_image(scores[img, cap], c, block)
        a, b, rsum = _direction_figures(i2t, t2i)
        folds.append({"i2t": a, "t2i": b, "rsum": rsum, "runs": (i2t, t2i)})
    mean = lambda d: {k: float(np.mean([fold[d][k] for fold in folds])) for k in folds[0][d]}  # noqa: E731
    i2t_runs = [fold.pop("runs") for fold in folds]
    queries = {
        "i2t_ranks": np.concatenate([r[0].ranks for r in i2t_runs]).tolist(),
        "t2i_ranks": np.concatenate([r[1].ranks for r in i2t_runs]).tolist(),
        "i2t_top1": np.concatenate([r[0].top[:, 0] + c * size * f for f, r in enumerate(i2t_runs)]).tolist(),
        "t2i_top": np.concatenate([r[1].top + size * f for f, r in enumerate(i2t_runs)]).tolist(),
    }
    return EvalResult(
        protocol=protocol,
        i2t=mean("i2t"),
        t2i=mean("t2i"),
        rsum=float(np.mean([fold["rsum"] for fold in folds])),
        folds=folds if len(folds) > 1 else [],
        queries=queries,
    )
