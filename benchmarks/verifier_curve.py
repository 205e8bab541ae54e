"""Learning curve of a grounded verifier head trained on a few thousand captions (issue 43, item 3).

A fresh ``grounded`` head on the FROZEN matching model of the zoo entry ``teran-mrsw-hn-scenes``
(its own head replaced by a freshly initialised one), trained by the trainer with a recipe's
settings (default ``verifier``: AdamW 2e-3, weight decay 0.01, 40 warm-up steps then constant,
400 steps of 128, one structural negative per caption, twins batched together; ``--lr`` and
``--steps`` override it) on the first N captions' images of the scenes train split, then scored
within each twin group of the scenes ``groups`` split, as ``xmatch eval --protocol groups
--rerank 20`` reports its row "the verifier deciding within each group" (t2i per kind of twin,
percent; chance 50). The head of the last step is scored (no validation split).

    OMP_NUM_THREADS=2 python benchmarks/verifier_curve.py --size small --captions 2000,4000 --seeds 0,1,2 --json curve.json
    OMP_NUM_THREADS=2 python benchmarks/verifier_curve.py --recipe scenes-verifier --captions 4000   # the 5e-4 recipe

``--size large`` takes N up to 100,000 (the large preset: its first use generates 22,000
pictures); ``small`` holds 4,000 training captions.
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

import xmatch
from xmatch.data import open_dataset
from xmatch.data.base import ImageTextDataset
from xmatch.eval import encode_dataset
from xmatch.eval.groups import GroupSet, dataset_groups, score_groups
from xmatch.eval.rerank import _verify_within_groups  # the within-group scoring xmatch eval reports
from xmatch.train import Trainer, load_recipe

MODEL = "teran-mrsw-hn-scenes"
KINDS = ("relation", "colour", "size")


class FirstImages(ImageTextDataset):
    """The first ``n_images`` images of a training split with all their captions, its word
    classes, and the hard-negative groups that lie wholly inside it."""

    def __init__(self, base: Any, n_images: int) -> None:
        self.base = base
        stop = int(np.searchsorted(base.caption_image, n_images))
        self._set_index(list(base.captions[:stop]), base.caption_image[:stop], list(base.image_names[:n_images]))
        self.split = f"{base.split}[:{n_images} images]"
        self.word_classes = base.word_classes

    def image(self, index: int) -> Any:
        return self.base.image(index)

    def hard_negative_groups(self) -> GroupSet:
        inside = [g for g in self.base.hard_negative_groups().groups if max(g.images) < self.num_images]
        return GroupSet(inside, self.caption_image)


def first_captions(base: Any, captions: int) -> FirstImages:
    """The images of the first ``captions`` captions (whole images, an even number: twins stay whole)."""
    if captions > len(base):
        raise SystemExit(f"--captions {captions}: the split holds {len(base)} captions; use --size large.")
    n_images = int(base.caption_image[captions - 1]) + 1
    return FirstImages(base, n_images + n_images % 2)


def fresh_head_model(seed: int) -> xmatch.MatchingModel:
    """``teran-mrsw-hn-scenes`` with its trained weights, its verifier re-initialised from ``seed``."""
    model = xmatch.build(MODEL, pretrained=True)
    torch.manual_seed(seed)
    model.verifier = xmatch.build(MODEL, pretrained=False).verifier
    return model


def within_groups(model: xmatch.MatchingModel, groups_split: Any, groups: GroupSet) -> dict[str, float]:
    """Within-group t2i (and group score) per kind, percent."""
    model.eval()
    encoded = encode_dataset(model, groups_split, progress=False)
    scores, _ = _verify_within_groups(model, encoded, groups, verify_batch=256)
    result = score_groups(scores, groups, resamples=0)
    figures = {}
    for kind in KINDS:
        row = result.by_kind[kind]
        figures[f"{kind}_t2i"], figures[f"{kind}_group"] = row["t2i"], row["group"]
    figures["all_t2i"], figures["all_group"] = result.overall["t2i"], result.overall["group"]
    return figures


def run(train: FirstImages, groups_split: Any, groups: GroupSet, recipe: str, overrides: dict[str, Any], seed: int) -> dict[str, Any]:
    """One head trained on ``train`` with ``recipe`` (plus ``overrides``), scored within groups."""
    config = load_recipe(recipe).merged({"seed": seed, "tensorboard": False, "log_every_steps": 10, **overrides})
    if config.max_steps is None:  # a recipe counted in epochs (scenes-verifier): its steps, on this split
        config = config.merged({"max_steps": config.epochs * math.ceil(len(train) / config.batch_size)})
    if config.epochs * math.ceil(len(train) / config.batch_size) < config.max_steps:
        config = config.merged({"epochs": math.ceil(config.max_steps / math.ceil(len(train) / config.batch_size))})
    model = fresh_head_model(seed)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as run_dir:
        result = Trainer(model, train, config, run_dir=Path(run_dir), progress=False).fit()
    train_s = time.perf_counter() - start
    figures = within_groups(model, groups_split, groups)
    return {"captions": len(train), "images": train.num_images, "recipe": recipe, "lr": config.lr, "seed": seed,
            "steps": result.steps, "last_loss": result.last_loss, "train_s": train_s, **figures}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="small", choices=["small", "large"], help="scenes preset of the training split")
    parser.add_argument("--captions", default="4000", help="comma-separated training sizes N (captions)")
    parser.add_argument("--recipe", default="verifier", help="the recipe (default: verifier)")
    parser.add_argument("--lr", type=float, help="learning rate (default: the recipe's)")
    parser.add_argument("--steps", type=int, help="optimizer steps per run (default: the recipe's max_steps, else its epochs)")
    parser.add_argument("--seeds", default="0", help="comma-separated seeds")
    parser.add_argument("--json", type=Path, help="write the rows here")
    args = parser.parse_args()

    overrides: dict[str, Any] = {}
    if args.lr is not None:
        overrides["lr"] = args.lr
    if args.steps is not None:
        overrides["max_steps"] = args.steps
    base = open_dataset("scenes", None, split="train", size=args.size, progress=False)
    groups_split = open_dataset("scenes", None, split="groups", size=args.size, progress=False)
    groups = dataset_groups(groups_split)
    rows = []
    for n in (int(x) for x in args.captions.split(",")):
        train = first_captions(base, n)
        for seed in (int(s) for s in args.seeds.split(",")):
            row = run(train, groups_split, groups, args.recipe, overrides, seed)
            rows.append(row)
            print(json.dumps(row), flush=True)
            if args.json:
                args.json.write_text(json.dumps(rows, indent=1))
    print("\n| captions | recipe | lr | seed | steps | relation t2i | colour t2i | size t2i | relation group | colour group | train s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['captions']:,} | {r['recipe']} | {r['lr']:g} | {r['seed']} | {r['steps']} | {r['relation_t2i']:.1f} | "
              f"{r['colour_t2i']:.1f} | {r['size_t2i']:.1f} | {r['relation_group']:.1f} | {r['colour_group']:.1f} | "
              f"{r['train_s']:.0f} |")


if __name__ == "__main__":
    main()
