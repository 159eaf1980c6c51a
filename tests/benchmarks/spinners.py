"""The processes spinning beside a ceiling (benchmarks/ceilings.py, `busy_cores`), counted by the tag they carry: by
the tests and by the stand-in vLLM the tests build, which runs in the ceiling's own process."""
import os

from benchmarks.ceilings import BUSY_TAG

TAG = BUSY_TAG.encode()


def spinning_now() -> int:
    count = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                count += TAG in f.read()
        except OSError:
            pass
    return count
