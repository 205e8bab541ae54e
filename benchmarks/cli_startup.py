"""The command line's start-up: CPU seconds of ``xmatch --help``, ``xmatch CMD --help``, ``xmatch
models`` and ``xmatch info NAME``.

Each command runs in a fresh interpreter; its CPU time (user + system, from the kernel's
accounting of the child) is the minimum of ``--repeats`` rounds, the commands interleaved in
each round with two references: an interpreter that does nothing, and one that imports torch
(what every command paid before the CLI stopped importing the model stack to parse arguments;
issue 41's target is under 0.5 s).

    python benchmarks/cli_startup.py --repeats 5
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys

from xmatch.cli.main import COMMANDS


def cpu_seconds(argv: list[str]) -> float:
    """User + system CPU seconds of one run of ``argv`` (its output discarded)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    python = [sys.executable, "-c"]
    runs = {
        "python (nothing)": [*python, "pass"],
        "python -c 'import torch'": [*python, "import torch"],
        "xmatch --help": [sys.executable, "-m", "xmatch", "--help"],
        **{f"xmatch {c} --help": [sys.executable, "-m", "xmatch", c, "--help"] for c in COMMANDS},
        # commands that answer from data alone (the zoo's TOML): they too run without torch
        "xmatch models": [sys.executable, "-m", "xmatch", "models"],
        "xmatch info teran-mrsw-coco": [sys.executable, "-m", "xmatch", "info", "teran-mrsw-coco"],
    }
    best = {name: float("inf") for name in runs}
    for _ in range(args.repeats):
        for name, argv in runs.items():
            best[name] = min(best[name], cpu_seconds(argv))
    load = os.getloadavg()[0]
    print(f"CPU seconds, minimum of {args.repeats} interleaved rounds (load average {load:.2f}, {os.cpu_count()} CPUs)")
    width = max(map(len, runs))
    for name, seconds in best.items():
        print(f"{name:<{width}}  {seconds:6.2f}")
    worst = max(v for k, v in best.items() if k.startswith("xmatch"))
    torch_import = best["python -c 'import torch'"]
    print(f"slowest xmatch command: {worst:.2f} s, {worst / torch_import:.2f}x importing torch")


if __name__ == "__main__":
    main()
