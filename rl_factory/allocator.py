"""glibc's allocator, set for CPU training: freed tensor memory stays in the process for the next step.

PyTorch's CPU tensors come from glibc's malloc. glibc serves a block above its mmap threshold (which adapts,
up to 32 MB) with a fresh mapping and unmaps it on free, so every training step faults its largest
activations (the logits and MLP outputs of a packed micro-batch) in again, page by page. On the 2-core VM
that ran at ~0.4 GB/s: the default job's update took 0.79-0.82 s a step instead of 0.61-0.65 (seed 6, 14
steps, A/B twice, 2026-12-01), and the extra varied with the step's tokens, widening the spread of step times. With
higher mmap and trim thresholds, freed blocks are reused; the process keeps its peak resident size.

Settings the user gives glibc (MALLOC_*_ or GLIBC_TUNABLES in the environment) are left as they are, and
other C libraries (musl, macOS) are left alone.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
# Blocks up to 1 GiB come from the heap; free memory at its top is returned only past ~2 GiB (mallopt's int).
MMAP_THRESHOLD = 1 << 30
TRIM_THRESHOLD = (1 << 31) - 1
USER_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "GLIBC_TUNABLES")

_applied: bool | None = None


def keep_freed_memory() -> bool:
    """Raise glibc's mmap and trim thresholds once per process; True when they are set (now or before)."""
    global _applied
    if _applied is not None:
        return _applied
    _applied = False
    if not sys.platform.startswith("linux") or any(k in os.environ for k in USER_SETTINGS):
        return False
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
        mallopt = libc.mallopt if libc is not None else None
    except (OSError, AttributeError):  # not glibc
        return False
    if mallopt is None:
        return False
    _applied = bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
    return _applied
