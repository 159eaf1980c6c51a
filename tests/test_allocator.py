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
def test_big_blocks_come_from_the_heap_unless_the_user_set_glibc():
    # set: the 64 MB tensor is no separate mapping (hblkhd counts mmapped bytes)
    assert _run({}) == ["True", "True", "False"]
    # the user's own glibc settings win: nothing is changed, and the block is mmapped as glibc does by default
    assert _run({"GLIBC_TUNABLES": "glibc.malloc.check=0"}) == ["False", "False", "True"]
