"""rl_factory.allocator: glibc's thresholds are raised once for CPU training, and never over the user's own."""
import os
import subprocess
import sys

import pytest

CHECK = """
import ctypes, ctypes.util, sys
from rl_factory.allocator import keep_freed_memory
first, again = keep_freed_memory(), keep_freed_memory()
# mallinfo2's arena grows when a 64 MB block is served from the heap instead of a fresh mapping
class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                               "fsmblks", "uordblks", "fordblks", "keepcost")]
libc = ctypes.CDLL(ctypes.util.find_library("c"))
libc.mallinfo2.restype = Info
import torch
t = torch.ones(16 << 20)  # 64 MB
info = libc.mallinfo2()
print(first, again, info.hblkhd >= 64 << 20)
"""


def _run(env_extra: dict) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES", "MALLOC_MMAP_THRESHOLD_",
                                                             "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_")}
    out = subprocess.run([sys.executable, "-c", CHECK], env={**env, **env_extra}, capture_output=True, text=True,
                         timeout=120, check=True)
    return out.stdout.split()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
@pytest.mark.slow  # two subprocesses that import torch
def test_big_blocks_come_from_the_heap_unless_the_user_set_glibc():
    # set: the 64 MB tensor is no separate mapping (hblkhd counts mmapped bytes)
    assert _run({}) == ["True", "True", "False"]
    # the user's own glibc settings win: nothing is changed, and the block is mmapped as glibc does by default
    assert _run({"GLIBC_TUNABLES": "glibc.malloc.check=0"}) == ["False", "False", "True"]


WARM = """
import resource, sys
import torch
from rl_factory.allocator import keep_freed_memory, warm_heap
keep_freed_memory()
warmed = warm_heap(256 << 20) if sys.argv[1] == "warm" else 0
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
t = torch.empty(192 << 20, dtype=torch.uint8)
t.fill_(1)  # first touch of every page
print(warmed, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
@pytest.mark.slow  # two subprocesses touching 192 MiB each
def test_a_warmed_heap_serves_the_first_big_step_without_page_faults():
    env = {k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES", "MALLOC_MMAP_THRESHOLD_",
                                                             "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_")}
    runs = {}
    for mode in ("warm", "cold"):
        out = subprocess.run([sys.executable, "-c", WARM, mode], env=env, capture_output=True, text=True,
                             timeout=120, check=True)
        runs[mode] = [int(x) for x in out.stdout.split()]
    assert runs["warm"][0] == 256 << 20 and runs["cold"][0] == 0
    # 192 MB is 49k pages of 4 KB: cold, they fault in one by one; warmed, they were touched at start-up
    assert runs["warm"][1] * 10 < runs["cold"][1]
    # with the user's own glibc settings nothing is kept, so nothing is warmed
    out = subprocess.run([sys.executable, "-c", WARM, "warm"], env={**env, "GLIBC_TUNABLES": "glibc.malloc.check=0"},
                         capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.split()[0] == "0"


def test_update_peak_estimate_follows_the_model_shape():
    from types import SimpleNamespace

    from rl_factory.allocator import update_peak_bytes

    tiny = SimpleNamespace(vocab_size=635, hidden_size=128, num_hidden_layers=4, intermediate_size=384)
    assert update_peak_bytes(tiny, 8192) == 4 * 8192 * (3 * 635 + 4 * (16 * 128 + 6 * 384))  # ~633 MB
    assert update_peak_bytes(tiny, 4096) * 2 == update_peak_bytes(tiny, 8192)
    assert update_peak_bytes(SimpleNamespace(hidden_size=128), 8192) == 0  # a config it cannot read: nothing
