"""What caption padding costs a training step: the text side (encoder, projection, reasoner)
forward + backward on one padded batch of COCO-length captions, against the same captions in
length groups (at most 12.5 % padding each), and the whole step of TERAN, alternated, minimum
of the repeats after the first (warm-up) round.

    python benchmarks/train_text_padding.py                            # the MiniLM package
    python benchmarks/train_text_padding.py --text-source bert-base    # BERT-base's shape, random weights

Caption lengths come from ``eval_speed.caption_lengths`` (COCO-like word pieces, see there).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Callable

import numpy as np
import torch
from eval_speed import caption_lengths
from train_speed import MINILM, WORDS, SyntheticRegions, build_model

from xmatch.model.parameter_counts import write_bert_base_dir

#: a group's padding slots may be at most this share of its slots, as in evaluation's buckets
MAX_PADDING = 0.125


def length_groups(lengths: np.ndarray) -> list[list[int]]:
    """Indices in length order, cut where a group's padding would pass ``MAX_PADDING``."""
    order = np.argsort(lengths, kind="stable").tolist()
    groups, current = [], [order[0]]
    for i in order[1:]:
        candidate = current + [i]
        if lengths[candidate].sum() >= (1 - MAX_PADDING) * lengths[i] * len(candidate):
            current = candidate
        else:
            groups.append(current)
            current = [i]
    return groups + [current]


def seconds(fn: Callable[[], torch.Tensor], model: torch.nn.Module) -> float:
    model.zero_grad(set_to_none=True)
    start = time.perf_counter()
    fn().backward()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--text-source", default=MINILM,
                        help="a text encoder source, or bert-base: TERAN's BERT-base shape with random weights")
    parser.add_argument("--batch-size", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        source = str(write_bert_base_dir(os.path.join(tmp, "bert-base"))) if args.text_source == "bert-base" else args.text_source
        model = build_model("cpu", text_source=source, pretrained_text=source == MINILM).train()
    rng = np.random.default_rng(0)
    # word pieces minus [CLS] and [SEP]; the benchmark's words are one piece each
    captions = [" ".join(rng.choice(WORDS, size=max(1, int(n) - 2))) for n in caption_lengths(args.batch_size, seed=3)]
    padded = model.tokenize(captions)
    lengths = padded.mask.sum(1).numpy()
    groups = length_groups(lengths)
    grouped = [model.tokenize([captions[i] for i in g]) for g in groups]
    batch = next(iter(SyntheticRegions(args.batch_size).loader(args.batch_size, shuffle=False)))

    def text_side(tokens) -> torch.Tensor:
        return model.encode_texts(tokens).tokens.sum()  # a TokenBatch is encoded as one batch, with gradients

    runs = {
        "padded text side": lambda: text_side(padded),
        "grouped text side": lambda: sum(text_side(t) for t in grouped),
        "whole step": lambda: model(batch).loss,
    }
    times: dict[str, list[float]] = {k: [] for k in runs}
    for _ in range(args.repeats + 1):
        for name, fn in runs.items():
            times[name].append(seconds(fn, model))
    best = {k: min(v[1:]) for k, v in times.items()}
    print(f"cpu, torch {torch.__version__}, {torch.get_num_threads()} threads, load average {os.getloadavg()[0]:.2f}; "
          f"text encoder {args.text_source}")
    print(f"{args.batch_size} captions: {int(lengths.sum())} real tokens in {padded.mask.numel()} slots "
          f"({1 - lengths.sum() / padded.mask.numel():.0%} padding); {len(groups)} length groups "
          f"{[len(g) for g in groups]}: {sum(t.mask.numel() for t in grouped)} slots")
    for name, value in best.items():
        print(f"{name:18s}: {value:.3f} s (forward + backward)")
    saved = best["padded text side"] - best["grouped text side"]
    print(f"length groups would save {saved:.3f} s = {saved / best['whole step']:.1%} of the step's forward + backward")


if __name__ == "__main__":
    main()
