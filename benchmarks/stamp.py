"""Copy a job's output to a log file, each line prefixed with `+SECONDS` since the copy started.

    bash main_grpo.sh trainer.backend=verl ... 2>&1 | python benchmarks/stamp.py outputs/run.log

verl's start-up (Ray, FSDP, vLLM's compile and CUDA graphs) prints no times of its own; the stamps say
where the minutes before the first step go. `how_it_ended` reads a benchmark job's run directory back: its exit
code, the run guard's bundles and the log lines that say why it stopped.
"""
from __future__ import annotations

import json
import re
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


ENDED_FILE = "bench_ended.json"  # the job's exit code (run_verl), for `how_it_ended`


def how_it_ended(run_dir: Path, lines: int = 20) -> dict:
    """The job's exit code, the run guard's bundles (a stop names its check and step) and the log's last lines that
    say why a job stopped: a record of a launch that ended early carries its cause, not only its steps."""
    try:
        code = json.loads((run_dir / ENDED_FILE).read_text())["exit_code"]
    except (OSError, ValueError, KeyError):
        code = None
    log = run_dir / "bench_stdout.log"
    text = log.read_text(errors="replace").splitlines() if log.exists() else []
    why = [line[:400] for line in text if re.search(r"guard:|Error|Traceback|error:", line)][-lines:]
    return {"exit_code": code, "guard_bundles": sorted(p.name for p in (run_dir / "guard").glob("step_*")),
            "log_lines": why}


if __name__ == "__main__":
    stamp_lines(sys.stdin.buffer, Path(sys.argv[1]))
