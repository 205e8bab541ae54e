"""Resident memory of a COCO-5K-size evaluation, phase by phase (Linux).

The same inputs as ``eval_speed.py`` (the full-size TERAN model loaded, COCO-like caption
lengths, embeddings bucketed as ``encode_dataset`` keeps them); before each phase the peak
resident size (VmHWM) is reset through ``/proc/self/clear_refs``, so each line is that phase's
own peak and what stays resident after it.

    python benchmarks/eval_memory.py                 # 5,000 images x 25,000 captions, one scoring step
    python benchmarks/eval_memory.py --steps 2       # two evaluation steps of 256 images
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import numpy as np
import torch
from eval_speed import STEP, caption_lengths, drawn_embeddings, full_size_teran

from xmatch.eval.protocol import evaluate_scores
from xmatch.core.memory import release_free_memory
from xmatch.model.parameter_counts import write_bert_base_dir


def resident_gib() -> tuple[float, float]:
    """(peak since the last reset, now), in GiB."""
    fields = {}
    with open("/proc/self/status") as status:
        for line in status:
            key, _, value = line.partition(":")
            fields[key] = value
    return int(fields["VmHWM"].split()[0]) / 2**20, int(fields["VmRSS"].split()[0]) / 2**20


def report(phase: str, before: float) -> float:
    peak, now = resident_gib()
    print(f"{phase:34s} peak {peak:6.3f} GiB ({peak - before:+.3f} over the phase's start), resident after {now:6.3f} GiB",
          flush=True)
    with open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")  # reset VmHWM to the current resident size
    return now


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=5000)
    parser.add_argument("--captions", type=int, default=25000)
    parser.add_argument("--steps", type=int, default=1, help="evaluation steps of 256 images to score")
    args = parser.parse_args()

    now = report("python, numpy, torch imported", 0.0)
    with tempfile.TemporaryDirectory() as tmp:
        model = full_size_teran(str(write_bert_base_dir(os.path.join(tmp, "bert-base-uncased"))), "cpu")
    release_free_memory()
    now = report("model built (teran-mrsw-coco)", now)
    images = drawn_embeddings(args.images, np.full(args.images, 36), model.embed_dim, seed=0)
    captions = drawn_embeddings(args.captions, caption_lengths(args.captions, seed=1), model.embed_dim, seed=1)
    now = report("embeddings (float32, bucketed)", now)
    scores = np.random.default_rng(0).random((args.images, args.captions), dtype=np.float32)
    now = report("score matrix (float32)", now)
    with torch.inference_mode():
        for start in range(0, min(args.steps * STEP, args.images), STEP):
            t = time.perf_counter()
            scores[start : start + STEP] = model.similarity(images[start : start + STEP], captions).numpy()
            print(f"  step of {STEP} images: {time.perf_counter() - t:.1f} s")
    now = report(f"scoring ({args.steps} step(s))", now)
    release_free_memory()
    now = report("freed pages handed back", now)
    t = time.perf_counter()
    evaluate_scores(scores, "full", captions_per_image=args.captions // args.images)
    print(f"  ranking both directions: {time.perf_counter() - t:.1f} s")
    report("ranking", now)


if __name__ == "__main__":
    main()
