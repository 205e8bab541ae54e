"""Small learnable image-caption data for training tests: every image holds three concepts
(a region each, a fixed random vector plus noise) and its captions name them."""

from __future__ import annotations

from pathlib import Path

import numpy as np

CONCEPTS = "dog giraffe puppy person boy kid teenager man tree frisbee stove pan".split()
FEATURE_DIM = 12
REGIONS = 4


def write_learnable_precomp(root: Path, split: str, n_images: int, seed: int) -> Path:
    """``<split>_ims.npy``, ``<split>_boxes.npy`` (normalised) and ``<split>_caps.txt`` in the
    scan-precomp layout (open with ``boxes_normalized=True``)."""
    root.mkdir(parents=True, exist_ok=True)
    prototypes = np.random.default_rng(1234).normal(size=(len(CONCEPTS), FEATURE_DIM)).astype(np.float32)
    rng = np.random.default_rng(seed)
    feats = np.empty((n_images, REGIONS, FEATURE_DIM), np.float32)
    boxes = np.empty((n_images, REGIONS, 4), np.float32)
    lines = []
    for i in range(n_images):
        picked = rng.choice(len(CONCEPTS), size=3, replace=False)
        feats[i, :3] = prototypes[picked] + 0.3 * rng.normal(size=(3, FEATURE_DIM))
        feats[i, 3] = rng.normal(size=FEATURE_DIM)
        xy = rng.random((REGIONS, 2)) * 0.5
        boxes[i] = np.concatenate([xy, xy + 0.25 + 0.25 * rng.random((REGIONS, 2))], axis=1)
        for _ in range(5):
            words = [CONCEPTS[k] for k in rng.permutation(picked)]
            lines.append(f"a {words[0]} with a {words[1]} and a {words[2]}")
    np.save(root / f"{split}_ims.npy", feats)
    np.save(root / f"{split}_boxes.npy", boxes)
    (root / f"{split}_caps.txt").write_text("\n".join(lines) + "\n")
    return root


def write_learnable(root: Path, n_train: int = 60, n_val: int = 20) -> Path:
    write_learnable_precomp(root, "train", n_train, seed=1)
    write_learnable_precomp(root, "dev", n_val, seed=2)
    return root
