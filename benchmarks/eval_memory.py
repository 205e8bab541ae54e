"""Resident memory of a COCO-5K-size evaluation, phase by phase (Linux).

The same inputs as ``eval_speed.py``: the full-size TERAN model (``teran-mrsw-coco``, BERT-base
text side, random weights) loaded, 25,000 captions of COCO-like word-piece lengths bucketed as
``encode_captions`` keeps them, 5,000 images of 36 regions, the 5,000 x 25,000 float32 score
matrix. Before each phase the peak resident size (VmHWM) is reset through
``/proc/self/clear_refs``, so each line is that phase's own peak and what stays resident after
it; the last line is the peak of the whole run (``/usr/bin/time -v`` of this script only sees
the peak since the last reset).

``--path`` chooses what is held while scoring:

- ``evaluate`` (default): what ``xmatch eval`` and ``xmatch.eval.evaluate`` hold
  (``score_dataset``): the captions, and the images of one step of 256, read back from the
  temporary file the image batches were written to when they were encoded, scored, dropped.
- ``two-stage``: every image's embeddings held beside the captions, scored 256 at a time
  (``encode_dataset`` then ``score_blocks``; what evaluation held before 2026-11-26, and what a
  caller of the public ``encode_images`` / ``encode_texts`` + ``similarity`` holds).
- ``public``: the same embeddings held, the model released before scoring, its pooler kept
  (``pooler = model.pooler; del model``): ``pooler(img, txt)`` is ``model.similarity(img, txt)``.

Embeddings are drawn at the model's width rather than encoded (encoding 25,000 captions takes
most of an hour on a 2-core CPU; the encoders run before the scores exist, so their
activations do not reach this peak: ``/usr/bin/time -v xmatch eval`` measures them too). Each
path takes a step or a few of 256 images; every step holds the same, so the peak of the first
is that of all twenty (scoring all of them takes 10-30 minutes on a 2-core CPU).

    python benchmarks/eval_memory.py                     # 5,000 x 25,000, one step, evaluate's path
    python benchmarks/eval_memory.py --path two-stage    # every image's embeddings held
    python benchmarks/eval_memory.py --path public --steps 2

``--write-cli-set DIR`` writes instead the same set for ``xmatch eval`` (2.3 GB): the images'
random region features and boxes in the TERAN layout (``features_36/bu_att``, ``bu_box``), the
captions in ``annotations/dataset_coco.json`` (words drawn from a small vocabulary, lengths
from the COCO model) and the full-size model's bundle in ``DIR/bundle``:

    python benchmarks/eval_memory.py --write-cli-set /tmp/coco5k
    /usr/bin/time -v xmatch eval local-dir:/tmp/coco5k/bundle --data /tmp/coco5k --dataset teran --split test --protocol coco-5k
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from eval_speed import STEP, WORDS, caption_lengths, drawn_embeddings, full_size_teran

import xmatch
from xmatch.core.memory import release_free_memory
from xmatch.eval.evaluate import _SpilledCaptions, _SpilledImages  # what score_dataset holds the embeddings in
from xmatch.model.embeddings import Embeddings
from xmatch.eval.protocol import evaluate_scores
from xmatch.model.parameter_counts import write_bert_base_dir

#: images per forward pass of the image encoder, as ``xmatch eval`` encodes them
IMAGE_BATCH = 64
PATHS = ("evaluate", "two-stage", "public")


def resident_gib() -> tuple[float, float]:
    """(peak since the last reset, now), in GiB."""
    fields = {}
    with open("/proc/self/status") as status:
        for line in status:
            key, _, value = line.partition(":")
            fields[key] = value
    return int(fields["VmHWM"].split()[0]) / 2**20, int(fields["VmRSS"].split()[0]) / 2**20


class Phases:
    """Prints each phase's own peak and what stays resident after it; keeps the run's peak."""

    def __init__(self) -> None:
        self.now, self.peak = 0.0, 0.0

    def report(self, phase: str) -> None:
        peak, now = resident_gib()
        print(f"{phase:50s} peak {peak:6.3f} GiB ({peak - self.now:+.3f} over the phase's start), "
              f"resident after {now:6.3f} GiB", flush=True)
        self.now, self.peak = now, max(self.peak, peak)
        with open("/proc/self/clear_refs", "w") as clear:
            clear.write("5")  # reset VmHWM to the current resident size


def spilled_images(n: int, dim: int) -> _SpilledImages:
    """``n`` images of 36 regions drawn in batches of :data:`IMAGE_BATCH`, each written to the
    temporary file as ``score_dataset`` writes the encoded batches (its own class)."""
    spilled = _SpilledImages()
    for start in range(0, n, IMAGE_BATCH):
        stop = min(start + IMAGE_BATCH, n)
        spilled.add(drawn_embeddings(stop - start, np.full(stop - start, 36), dim, seed=start).to_embeddings())
        release_free_memory()
    return spilled


def spilled_captions(n: int, lengths: np.ndarray, dim: int, seed: int, batch: int = 256) -> _SpilledCaptions:
    """Unit-norm token sets of the given lengths, drawn batch by batch in length order (the
    longest batch first, as ``encode_captions`` encodes them), each batch written to the
    temporary file and the buckets filled from there as ``score_dataset`` does (its own class)."""
    g = torch.Generator().manual_seed(seed)
    order = np.argsort(lengths, kind="stable")
    chosen = [order[start : start + batch] for start in range(0, n, batch)]

    def drawn():
        for b in reversed(range(len(chosen))):
            width = int(lengths[chosen[b]].max())
            tokens = F.normalize(torch.randn(len(chosen[b]), width, dim, generator=g), dim=-1)
            yield b, Embeddings(tokens, torch.arange(width)[None] < torch.from_numpy(lengths[chosen[b]])[:, None])

    return _SpilledCaptions.from_batches(drawn(), [torch.from_numpy(idx.astype(np.int64)) for idx in chosen])


def write_cli_set(root: Path, n_images: int, n_captions: int) -> None:
    """The benchmark's set as a TERAN-layout data folder with a bundle, for ``xmatch eval``."""
    if n_captions % n_images:
        raise SystemExit(f"--captions {n_captions} is not a multiple of --images {n_images}.")
    per_image = n_captions // n_images
    rng = np.random.default_rng(0)
    lengths = caption_lengths(n_captions, seed=1)
    for folder in ("bu_att", "bu_box"):
        (root / "features_36" / folder).mkdir(parents=True, exist_ok=True)
    (root / "annotations").mkdir(exist_ok=True)
    images = []
    for i in range(n_images):
        np.savez(root / "features_36" / "bu_att" / str(i), feat=rng.random((36, 2048), dtype=np.float32))
        xy = rng.random((36, 2), dtype=np.float32) * np.float32([320, 240])
        np.save(root / "features_36" / "bu_box" / str(i), np.concatenate([xy, xy + np.float32([300, 220])], 1))
        # word pieces = words + [CLS] and [SEP]: every word of WORDS is one piece
        sentences = [{"raw": " ".join(rng.choice(WORDS, size=max(1, int(k) - 2))), "imgid": i, "sentid": per_image * i + j}
                     for j, k in enumerate(lengths[per_image * i : per_image * (i + 1)])]
        images.append({"imgid": i, "split": "test", "filename": f"{i}.jpg", "width": 640, "height": 480,
                       "sentids": [s["sentid"] for s in sentences], "sentences": sentences})
    (root / "annotations" / "dataset_coco.json").write_text(json.dumps({"images": images, "dataset": "coco"}))
    with tempfile.TemporaryDirectory() as tmp:
        model = full_size_teran(str(write_bert_base_dir(os.path.join(tmp, "bert-base-uncased"))), "cpu")
        xmatch.save_pretrained(model, root / "bundle")
    print(f"wrote {n_images} images, {n_captions} captions and the bundle in {root}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=5000)
    parser.add_argument("--captions", type=int, default=25000)
    parser.add_argument("--steps", type=int, default=1, help="evaluation steps of 256 images to score")
    parser.add_argument("--path", choices=PATHS, default="evaluate", help="what is held while scoring (see above)")
    parser.add_argument("--write-cli-set", type=Path, metavar="DIR", help="write the set for xmatch eval instead (see above)")
    args = parser.parse_args()
    if args.write_cli_set:
        write_cli_set(args.write_cli_set, args.images, args.captions)
        return

    phases = Phases()
    phases.report("python, numpy, torch, xmatch imported")
    with tempfile.TemporaryDirectory() as tmp:
        model = full_size_teran(str(write_bert_base_dir(os.path.join(tmp, "bert-base-uncased"))), "cpu")
    release_free_memory()
    phases.report("model built (teran-mrsw-coco)")
    if args.path == "evaluate":
        spilled = spilled_images(args.images, model.embed_dim)
        phases.report("images written to a temporary file, batch by batch")
    lengths = caption_lengths(args.captions, seed=1)
    if args.path == "evaluate":
        captions = spilled_captions(args.captions, lengths, model.embed_dim, seed=1)
        phases.report("captions written to a temporary file, bucket by bucket")
    else:
        captions = drawn_embeddings(args.captions, lengths, model.embed_dim, seed=1)
        phases.report("captions (float32, bucketed)")
    images = None
    if args.path != "evaluate":
        images = drawn_embeddings(args.images, np.full(args.images, 36), model.embed_dim, seed=0)
        phases.report("every image's embeddings (float32)")
    score = model.similarity
    if args.path == "public":
        score = model.pooler  # what model.similarity(img, txt) calls
        del model
        release_free_memory()
        phases.report("model released, its pooler kept")
    # touched, as it is once the last step is written
    scores = np.random.default_rng(0).random((args.images, args.captions), dtype=np.float32)
    phases.report("score matrix (float32)")
    steps = range(0, min(args.steps * STEP, args.images), STEP)
    with torch.inference_mode():
        if images is None:  # score_dataset's order: one caption bucket read back at a time, each step of images against it
            t = time.perf_counter()
            for k in range(len(captions)):
                bucket, positions = captions.bucket(k, torch.device("cpu"))
                for start in steps:
                    step = spilled.read(start, min(start + STEP, args.images), torch.device("cpu"))
                    scores[start : start + len(step), positions.numpy()] = score(step, bucket).numpy()
                    del step
                del bucket
                release_free_memory()
            print(f"  {len(steps)} step(s) of images against {len(captions)} caption buckets: {time.perf_counter() - t:.1f} s",
                  flush=True)
        else:
            for start in steps:
                t = time.perf_counter()
                stop = min(start + STEP, args.images)
                step = images[start:stop]
                scores[start:stop] = score(step, captions).numpy()
                del step
                print(f"  step of {stop - start} images: {time.perf_counter() - t:.1f} s", flush=True)
    phases.report(f"scoring ({args.steps} step(s){', images and caption buckets read back' if images is None else ''})")
    release_free_memory()
    phases.report("freed pages handed back")
    t = time.perf_counter()
    evaluate_scores(scores, "full", captions_per_image=args.captions // args.images)
    print(f"  ranking both directions: {time.perf_counter() - t:.1f} s")
    phases.report("ranking")
    print(f"peak of the run ({args.path}): {phases.peak:.3f} GiB")


if __name__ == "__main__":
    main()
