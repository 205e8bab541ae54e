"""Time per training step of the hard-negative recipes against the plain recipe, in one run.

Every variant trains ``teran-mrsw-scenes`` from the same initial weights on the same batches
of the scenes benchmark's train split (``--size``, the ``small`` preset by default: batches of
64 pairs; the negatives add up to 2 captions per pair):

- ``plain``: the ``scenes-teran`` recipe;
- ``hn``: ``scenes-teran-hn`` (structural negatives with the scenes' word lists, twin groups);
- ``hn-spacy``: the same with ``word_classes = "spacy"``;
- ``hn-geo``: ``scenes-teran-hn`` with ``image_reasoner.geometry=relative``;
- ``hn-spacy-geo``: both, the documented recipe for another dataset (docs/training.md).

Each variant gets its own trainer (built as ``xmatch train`` builds it, so a spaCy variant
parses or reads its captions' parses before the first step) and runs the same ``--batches``
batches once per round: a step is the trainer's micro-step (negatives drawn, forward,
backward) and optimizer step, the next batch's negatives drawn during
the step as ``Trainer.fit`` draws them (the trainer's own private steps are driven, so that
every variant runs exactly the same batches). Round ``r`` draws the negatives of epoch ``r``, as
successive epochs of a run would: a negative drawn again in a later epoch finds its parse
cached, one drawn for the first time is parsed. The variants take turns, the order rotated each round, so all
share the machine's load alike; each variant's figure is its fastest round (the first round,
building the optimizer state, is printed apart) beside the mean of the later rounds, and the ratios are to ``plain``'s fastest
round. The CPU's vector instructions and the load average are printed with the figures.

    OMP_NUM_THREADS=1 python benchmarks/negatives_cost.py --rounds 4 --batches 4
    OMP_NUM_THREADS=1 python benchmarks/negatives_cost.py --variants plain hn-spacy-geo
    OMP_NUM_THREADS=1 python benchmarks/negatives_cost.py --variants plain hn hn-spacy-geo --no-check
"""

from __future__ import annotations

import argparse
import contextlib
import os
import tempfile
import time
from pathlib import Path

import torch

VARIANTS = {
    "plain": ("scenes-teran", {}, None),
    "hn": ("scenes-teran-hn", {}, None),
    "hn-spacy": ("scenes-teran-hn", {}, "spacy"),
    "hn-geo": ("scenes-teran-hn", {"image_reasoner": {"geometry": "relative"}}, None),
    "hn-spacy-geo": ("scenes-teran-hn", {"image_reasoner": {"geometry": "relative"}}, "spacy"),
}


def cpu_flags() -> str:
    """The vector instructions of this CPU that matter for float32 products."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "unknown CPU"
    model = next((line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("model name")), "?")
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), [])
    wanted = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_tile") if f in flags]
    return f"{model}, {os.cpu_count()} CPUs, " + (" ".join(wanted) or "no AVX2")


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def build_trainer(name: str, train, run_root: Path):
    import xmatch
    from xmatch.train import Trainer, load_recipe

    recipe, overrides, word_classes = VARIANTS[name]
    config = load_recipe(recipe)
    if word_classes:
        config = config.merged({"negatives": {"word_classes": word_classes}})
    torch.manual_seed(0)
    model = xmatch.build("teran-mrsw-scenes", **overrides)
    start = time.perf_counter()
    trainer = Trainer(model, train, config, run_dir=run_root / name, device="cpu", progress=False)
    built = time.perf_counter() - start
    trainer._prepare()
    trainer.model.train()
    return trainer, built


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--rounds", type=int, default=4, help="rounds of every variant (the first one is printed apart)")
    parser.add_argument("--batches", type=int, default=4, help="batches per round")
    parser.add_argument("--size", default="small", help="scenes preset")
    parser.add_argument("--no-check", action="store_true",
                        help="skip the negatives' validity check (what the rest of the negatives costs)")
    args = parser.parse_args()
    from xmatch.data import open_dataset

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    print(f"{cpu_flags()}; torch {torch.__version__}, {torch.get_num_threads()} thread(s); load average {load()}")
    train = open_dataset("scenes", None, split="train", size=args.size)
    trainers, batches = {}, {}
    with tempfile.TemporaryDirectory() as runs:
        for name in args.variants:
            trainer, built = build_trainer(name, train, Path(runs))
            if args.no_check and trainer.negatives is not None:
                trainer.negatives.check = False
            trainers[name] = trainer
            batches[name] = [b for _, b in zip(range(args.batches), trainer._loader(0, 0))]
            print(f"{name:13s} trainer built in {built:6.2f} s (a spaCy variant parses or reads its captions here)")
        pairs = {name: sum(len(b) for b in bs) for name, bs in batches.items()}
        times: dict[str, list[float]] = {name: [] for name in trainers}
        order = list(trainers)
        for r in range(args.rounds):
            state = {"epoch": r, "step": 0, "batch": 0}
            for name in order[r % len(order):] + order[: r % len(order)]:
                trainer = trainers[name]
                start = time.perf_counter()
                for batch, upcoming in zip(batches[name], [*batches[name][1:], None]):
                    # as Trainer.fit steps: the next batch's negatives drawn during this step (where
                    # the trainer does that; an older one draws them in the step)
                    ahead = getattr(trainer, "_drawing_ahead", None)
                    with ahead(upcoming, r) if ahead is not None else contextlib.nullcontext():
                        trainer._micro_step(batch, state, 1, True)
                    trainer._optimizer_step()
                times[name].append((time.perf_counter() - start) / len(batches[name]))
    base = min(times[order[0]][1:] or times[order[0]])
    print(f"per step, {args.batches} batches x {args.rounds} rounds (round r: epoch r's negatives), order rotated "
          f"each round (ratios to {order[0]}'s fastest round):")
    for name, per_round in times.items():
        later = per_round[1:] or per_round
        best, mean = min(later), sum(later) / len(later)
        print(f"{name:13s} first round {per_round[0]:6.3f} s, fastest {best:6.3f} s ({best / base:4.2f}x), "
              f"mean of the later rounds {mean:6.3f} s ({mean / base:4.2f}x), {pairs[name] / len(batches[name]):.0f} pairs/step")
    print(f"load average after: {load()}")


if __name__ == "__main__":
    main()
