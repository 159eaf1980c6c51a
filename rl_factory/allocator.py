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


# Bytes per token of an fp32 update's peak, from the model's shape: the logits, their log-softmax and its
# gradient (3 x vocab floats) and, per layer, what forward saves and backward makes (~16 x hidden: norms, q/k/v/o,
# residuals, attention output; ~6 x intermediate: gate, up, activation, product and their gradients).
# Checked on the tiny model: 77 KB a token x 8192 = 633 MB, against 550 MB that its updates faulted in.
def update_peak_bytes(config, tokens: int) -> int:
    """An estimate of the activation memory of one micro-batch of `tokens` tokens (0 if the config is unusual)."""
    try:
        vocab, hidden, layers = config.vocab_size, config.hidden_size, config.num_hidden_layers
        intermediate = getattr(config, "intermediate_size", None) or 4 * hidden
    except AttributeError:
        return 0
    return 4 * tokens * (3 * vocab + layers * (16 * hidden + 6 * intermediate))


def warm_heap(nbytes: int) -> int:
    """Fault in `nbytes` of the heap once, before the first step; returns the bytes touched (0: nothing done).

    With freed memory kept (`keep_freed_memory`), what an update frees stays in the process, but each new
    high-water mark still arrives page by page on first touch: the default job's first update and the step
    whose trajectories first grew longest faulted in ~240 MB each (60k page faults, +0.5 s: 1.37 s instead of
    0.80, seed 4 step 4). One block touched now and freed leaves that much free, touched heap for the steps
    to allocate from. Capped below the mmap threshold (a bigger block would be a mapping, unmapped on free)
    and at a quarter of the memory available. Call it from the thread that trains (glibc's main arena).
    """
    if not _applied or nbytes <= 0:
        return 0
    nbytes = min(nbytes, MMAP_THRESHOLD - (64 << 20), _available_bytes() // 4)
    if nbytes <= 0:
        return 0
    import torch

    block = torch.empty(nbytes, dtype=torch.uint8)
    block.fill_(0)  # every page written once
    del block
    return nbytes


def _available_bytes() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0
