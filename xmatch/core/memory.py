"""Give freed memory back to the operating system, or keep it for the next picture.

glibc keeps blocks below its (adaptive, up to 32 MB) mmap threshold in the heap after they
are freed: a loop that encodes a corpus batch by batch and then copies the batches into
length buckets leaves every released batch as a resident hole, so the process holds the
corpus about twice although only one copy is alive. ``malloc_trim`` returns those pages.
Elsewhere (macOS, musl, Windows) the allocator has no such call and this is a no-op.

The opposite is what an extraction needs: glibc maps every block above 32 MB afresh and unmaps
it when freed, and the kernel zeroes each of its pages again on first touch. A 600-px picture's
backbone allocates about 340 MB of such blocks, so a third of ``xmatch extract``'s CPU time
was the kernel's (docs/extract.md, "Where the system time went"). :func:`keep_freed_memory`
makes glibc take those blocks from its heap and keep them there when freed.

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
import os


#: mallopt's parameters (glibc's malloc.h)
M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4
#: the environment variable that leaves the allocator as it is (``XMATCH_MALLOC=system``)
MALLOC_ENV = "XMATCH_MALLOC"


@functools.cache
def _libc():
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name) if name else None
    except OSError:
        return None


def _malloc_trim():
    libc = _libc()
    return getattr(libc, "malloc_trim", None) if libc is not None else None


def keep_freed_memory() -> bool:
    """Make glibc serve every block from its heap and keep freed blocks there (no ``mmap`` per
    large block, no heap trimming), so that a loop allocating the same large tensors for each
    item reuses their pages instead of having the kernel map and zero them again. The process
    keeps its peak heap until it exits (``xmatch extract``: about 2.4 GB where it peaked at
    1.9 GB, 48 photos). Returns ``True`` if the allocator took the settings; a no-op returning
    ``False`` outside glibc or with ``XMATCH_MALLOC=system`` in the environment.

    For a process that runs one job, such as a command of the ``xmatch`` command line; a
    library call never changes it.
    """
    if os.environ.get(MALLOC_ENV, "").strip().lower() == "system":
        return False
    libc = _libc()
    mallopt = getattr(libc, "mallopt", None) if libc is not None else None
    if mallopt is None:
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    # the largest trim threshold an int holds: the heap's top is never given back while the job runs
    return bool(mallopt(M_MMAP_MAX, 0)) and bool(mallopt(M_TRIM_THRESHOLD, 2**31 - 1))


def release_free_memory() -> bool:
    """Return the heap's free pages to the system where the C library can (glibc); ``True``
    if it released any."""
    trim = _malloc_trim()
    return bool(trim(0)) if trim is not None else False
