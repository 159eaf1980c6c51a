"""Copy a job's output to a log file, each line prefixed with `+SECONDS` since the copy started.

    bash main_grpo.sh trainer.backend=verl ... 2>&1 | python benchmarks/stamp.py outputs/run.log

verl's start-up (Ray, FSDP, vLLM's compile and CUDA graphs) prints no times of its own; the stamps say
where the minutes before the first step go.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import BinaryIO


def stamp_lines(stream: BinaryIO, path: Path, t0: float | None = None) -> None:
    """Copy `stream` to `path` line by line, each prefixed with the seconds since `t0` (default: now)."""
    t0 = time.perf_counter() if t0 is None else t0
    with path.open("w", encoding="utf-8", errors="replace") as out:
        for raw in iter(stream.readline, b""):
            out.write(f"+{time.perf_counter() - t0:7.1f}s {raw.decode('utf-8', 'replace')}")
            out.flush()


if __name__ == "__main__":
    stamp_lines(sys.stdin.buffer, Path(sys.argv[1]))
