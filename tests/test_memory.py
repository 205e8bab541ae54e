"""Freed heap memory goes back to the system (the evaluation's encoding loops rely on it)."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest
import torch

from xmatch.core.memory import release_free_memory


def resident_kib() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS"))


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc_trim is glibc's")
def test_freed_heap_holes_are_returned():
    # 64 KiB blocks live in the heap, whatever the adaptive mmap threshold; a block allocated
    # after them keeps the heap's top in place, so freeing them leaves a resident hole
    blocks = [torch.ones(16 * 1024) for _ in range(1600)]  # 100 MiB, pages touched
    pin = torch.ones(16 * 1024)
    before = resident_kib()
    del blocks
    held = resident_kib()
    assert held > before - 50 * 1024  # glibc kept (most of) the freed blocks
    assert release_free_memory() is True
    assert resident_kib() < held - 80 * 1024
    assert pin.sum() == 16 * 1024


#: run in a process of its own (the allocator's settings hold for the whole process): page
#: faults per round of a forward pass's pattern, each layer's 64-128 MiB output made from the
#: last one and freed when the next one is (above glibc's largest mmap threshold, 32 MiB)
FAULTS_PER_ROUND = """
import resource, torch
from xmatch.core.memory import keep_freed_memory
kept = keep_freed_memory()
x = torch.ones(16 * 1024 * 1024)
faults = []
for _ in range(6):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    h = x
    for layer in range(5):
        h = h.repeat(2) if layer % 2 == 0 else h[: len(h) // 2] + 1
    del h
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(kept, *faults)
"""


def faults_per_round(environment: dict[str, str]) -> tuple[bool, list[int]]:
    env = {k: v for k, v in os.environ.items() if k != "XMATCH_MALLOC"} | environment
    out = subprocess.run([sys.executable, "-c", FAULTS_PER_ROUND], env=env, capture_output=True, text=True, check=True)
    kept, *faults = out.stdout.split()
    return kept == "True", [int(f) for f in faults]


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_kept_blocks_are_not_mapped_and_zeroed_again():
    kept, faults = faults_per_round({})
    system_kept, system = faults_per_round({"XMATCH_MALLOC": "system"})
    assert kept and not system_kept
    assert min(system) > 100_000, system  # every round's blocks mapped and faulted in anew
    # kept: the first round faults its blocks' pages in; later rounds reuse them (the heap grows
    # now and then while its free blocks settle: at most 15 % of the system's faults measured)
    assert faults[0] > 60_000 and sum(faults[1:]) < 0.3 * sum(system[1:]), (faults, system)


def test_xmatch_extract_keeps_freed_memory(monkeypatch, tmp_path):
    from xmatch.cli import extract as extract_cli
    from xmatch.core import memory

    called = []
    monkeypatch.setattr(memory, "keep_freed_memory", lambda: called.append(True) or True)
    monkeypatch.setattr("xmatch.extract.run.extract", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("stop")))
    from xmatch.cli.main import build_parser

    args = build_parser().parse_args(["extract", str(tmp_path), "--out", str(tmp_path / "out")])
    with pytest.raises(RuntimeError, match="stop"):
        extract_cli.run(args)
    assert called == [True]


@pytest.mark.slow
@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_extraction_with_kept_memory_writes_the_same_features(tmp_path):
    # reused pages hold the last picture's values: a kernel that read memory it never wrote
    # would show it here, as features that differ from an extraction on freshly zeroed pages
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    pictures = tmp_path / "pictures"
    pictures.mkdir()
    for k in range(4):  # one size: batched together, so the defaults' blocks are well above 32 MiB
        Image.fromarray(rng.integers(0, 256, (256, 256, 3), dtype=np.uint8)).save(pictures / f"{k}.png")
    arrays = {}
    for name, environment in (("kept", {}), ("system", {"XMATCH_MALLOC": "system"})):
        env = {k: v for k, v in os.environ.items() if k != "XMATCH_MALLOC"} | environment
        subprocess.run([sys.executable, "-m", "xmatch", "extract", str(pictures), "--out", str(tmp_path / name),
                        "--no-progress"], env=env, check=True, capture_output=True)
        files = sorted((tmp_path / name).rglob("*.npz"))
        arrays[name] = {f.relative_to(tmp_path / name): dict(np.load(f)) for f in files}
    assert len(arrays["kept"]) == 4 and arrays["kept"].keys() == arrays["system"].keys()
    for path, kept in arrays["kept"].items():
        for key, value in kept.items():
            np.testing.assert_array_equal(value, arrays["system"][path][key], err_msg=f"{path}: {key}")
