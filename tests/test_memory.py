"""Freed heap memory goes back to the system (the evaluation's encoding loops rely on it)."""

from __future__ import annotations

import platform

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
