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


ONEDNN_CACHES = ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY")
SERVING_CACHE_CAPACITY = 64


def bound_onednn_caches(capacity: int = SERVING_CACHE_CAPACITY) -> None:
    """Keep at most ``capacity`` compiled oneDNN primitives in each of its two caches (before torch loads).

    oneDNN, under torch's CPU matmuls (:class:`mtkit.kernels.linear.PackedLinear`, bf16), compiles a
    primitive for each matrix shape it meets and keeps up to 1024 of them, in oneDNN's own cache
    (``ONEDNN_PRIMITIVE_CACHE_CAPACITY``) and in the ideep layer torch calls it through
    (``LRU_CACHE_CAPACITY``). A server meets a new batch shape with nearly every request: measured on
    the Multi30k model, 2 decoding threads, 1,500 requests of 1-16 sentences, RSS 290 -> 764 MiB with the
    defaults, 357 MiB without oneDNN, 446 MiB at 64 each, in the same time (benchmarks/README.md).
    A value the user set in the environment wins.
    """
    for name in ONEDNN_CACHES:
        os.environ.setdefault(name, str(capacity))
