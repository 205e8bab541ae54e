"""The bootstrap intervals of the hard-negative groups protocol: what they cost beside the
figures they bound.

``score_groups`` (``xmatch eval --protocol groups``) scores the groups once and then resamples
them ``--resamples`` times for the 95% intervals of every figure of every kind. Here that is
timed on synthetic twins (groups of two images, five captions each, noisy scores) against the
same call without intervals (``resamples=0``), the two interleaved, each the minimum of
``--repeats`` rounds. A loop over the resamples would cost about ``resamples`` times the point
figures; the vectorised bootstrap costs a few times them.

    python benchmarks/groups_bootstrap.py --groups 1000 --resamples 1000 --repeats 5

This was a timed assertion in the test suite (under 1 s for 1,000 groups); timings belong here.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
import torch

from xmatch.eval.groups import Group, GroupSet, score_groups

KINDS = ("relation", "colour", "size")


def twins(n_groups: int, captions: int, signal: float, seed: int) -> tuple[np.ndarray, GroupSet]:
    """``[images, captions]`` scores with the matching image ahead by ``signal`` standard
    deviations on average, and the groups (pairs of images, three kinds in turn)."""
    owner = np.repeat(np.arange(2 * n_groups), captions)
    scores = np.random.default_rng(seed).normal(size=(2 * n_groups, len(owner)))
    scores[owner, np.arange(len(owner))] += signal
    groups = GroupSet([Group((2 * g, 2 * g + 1), KINDS[g % 3]) for g in range(n_groups)], owner)
    return scores, groups


def best_seconds(groups: int, captions: int, resamples: int, repeats: int, seed: int = 0) -> tuple[float, float]:
    """Minimum seconds of ``score_groups`` with ``resamples`` intervals and without, interleaved."""
    scores, group_set = twins(groups, captions, 0.5, seed)
    with_intervals, point = [], []
    for _ in range(repeats):
        for runs, count in ((with_intervals, resamples), (point, 0)):
            start = time.perf_counter()
            score_groups(scores, group_set, resamples=count, seed=seed)
            runs.append(time.perf_counter() - start)
    return min(with_intervals), min(point)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--groups", type=int, default=1000)
    parser.add_argument("--captions", type=int, default=5, help="captions per image")
    parser.add_argument("--resamples", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    bootstrap, point = best_seconds(args.groups, args.captions, args.resamples, args.repeats)
    flags = sorted({f for f in open("/proc/cpuinfo").read().split() if f.startswith(("avx", "amx"))}) \
        if os.path.exists("/proc/cpuinfo") else []
    print(f"{args.groups} groups x {args.captions} captions per image, {args.resamples} resamples, best of {args.repeats}")
    print(f"with intervals {bootstrap:.3f} s, point figures alone {point:.3f} s: {bootstrap / point:.1f}x")
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs; torch CPU capability "
          f"{torch.backends.cpu.get_cpu_capability()}; flags {' '.join(flags) or 'unknown'}")


if __name__ == "__main__":
    main()
