"""Keep freed memory in the process for reuse, instead of handing it back to the OS.

PyTorch's CPU allocator takes every tensor straight from ``malloc``. glibc serves large
requests (above a 128 KiB-32 MiB threshold) with fresh ``mmap`` pages and returns them to
the kernel on ``free``, so a training step that allocates the same large activations every
time pays page faults every time: measured slower training steps in the VMs used here
(benchmarks/README.md, design measurements). Raising glibc's mmap and trim thresholds keeps
the pages in the heap: the same effect as the jemalloc / tcmalloc preload that PyTorch's CPU
tuning guides recommend, without a preload. The price is that the process keeps its peak heap size.

Only glibc on Linux has ``mallopt``; elsewhere this does nothing. ``MTKIT_KEEP_FREED_MEMORY=0``
turns it off.
"""

from __future__ import annotations

import ctypes
import os
import sys

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
THRESHOLD = 1 << 30  # 1 GiB: larger single requests still get their own mapping


def keep_freed_memory() -> bool:
    """Raise glibc's thresholds for this process; True when they were set."""
    if not sys.platform.startswith("linux") or os.environ.get("MTKIT_KEEP_FREED_MEMORY") == "0":
        return False
    mallopt = getattr(ctypes.CDLL(None), "mallopt", None)  # the process's own libc: no library search
    if mallopt is None:  # not glibc (e.g. musl has no mallopt)
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    return bool(mallopt(M_MMAP_THRESHOLD, THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, THRESHOLD))
