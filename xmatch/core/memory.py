"""Give freed memory back to the operating system.

glibc keeps blocks below its (adaptive, up to 32 MB) mmap threshold in the heap after they
are freed: a loop that encodes a corpus batch by batch and then copies the batches into
length buckets leaves every released batch as a resident hole, so the process holds the
corpus about twice although only one copy is alive. ``malloc_trim`` returns those pages.
Elsewhere (macOS, musl, Windows) the allocator has no such call and this is a no-op.

Example:
    >>> import torch
    >>> parts = [torch.randn(64, 16) for _ in range(1000)]
    >>> del parts
    >>> freed = release_free_memory()  # True on glibc when pages went back
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools


@functools.cache
def _malloc_trim():
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):
        return None


def release_free_memory() -> bool:
    """Return the heap's free pages to the system where the C library can (glibc); ``True``
    if it released any."""
    trim = _malloc_trim()
    return bool(trim(0)) if trim is not None else False
