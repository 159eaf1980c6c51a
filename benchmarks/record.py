"""One JSON line per benchmark invocation: printed, and appended to benchmarks/results/<benchmark>.jsonl.

Every script in benchmarks/ ends with `emit("<benchmark>", result)` instead of printing its own line.
The record adds where and when the numbers were measured (`machine`, `commit`, `date`, `command`), so
`docs/benchmarks.md` is generated from the records (docsgen/benchmarks_page.py) instead of being
written by hand.

BENCH_RESULTS_DIR picks another directory; set to an empty string it records nothing. BENCH_COMMIT names the
commit where the checkout has no git history (see `commit`). Under pytest
(PYTEST_CURRENT_TEST set, inherited by subprocesses) nothing is recorded unless BENCH_RESULTS_DIR is set,
so the tests that run the scripts leave the results alone.
"""
from __future__ import annotations

import datetime
import json
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo), else what platform reports."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def gpu_names() -> list[str]:
    """Names of the visible NVIDIA GPUs (nvidia-smi), [] without one. Never imports torch for it."""
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.strip() for line in out.splitlines() if line.strip()]


def boot_id() -> str | None:
    """The kernel's random id of this boot: two records with the same one ran on one machine, without naming it."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip() or None
    except OSError:
        return None


def machine() -> dict[str, Any]:
    """What the numbers were measured on, without the host's name."""
    info: dict[str, Any] = {"cpu": cpu_model(), "cores": os.cpu_count()}
    try:  # the model name of a cloud VM's CPU is often generic; its vector width moves CPU numbers most
        info["avx512"] = re.search(r"\bavx512f\b", Path("/proc/cpuinfo").read_text().split("\n\n")[0]) is not None
    except OSError:
        pass
    gpus = gpu_names()
    if gpus:
        info["gpu"] = gpus[0]
        info["gpus"] = len(gpus)
    try:
        pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        info["memory_gb"] = round(pages / 2**30, 1)
    except (ValueError, OSError, AttributeError):
        pass
    info["python"] = platform.python_version()
    if boot_id():
        info["boot_id"] = boot_id()
    if hasattr(os, "getloadavg"):
        info["loadavg_1m"] = round(os.getloadavg()[0], 2)
    return info


def commit() -> str:
    """`git rev-parse HEAD` of the checkout the script ran from, with "-dirty" when files differ from it.

    BENCH_COMMIT, where set, is taken instead: a copy of the tree without its .git (a lent GPU machine gets
    one) cannot ask git, and the one who sent it knows the commit.
    """
    if os.environ.get("BENCH_COMMIT"):
        return os.environ["BENCH_COMMIT"]
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, timeout=30).stdout
    try:
        head = git("rev-parse", "--short=12", "HEAD").strip()
        dirty = git("status", "--porcelain", "--untracked-files=no").strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (head + "-dirty" if dirty else head) or "unknown"


def command_line(argv: list[str] | None = None) -> str:
    """The invocation as a shell line: the interpreter and the script relative to the repository root."""
    argv = list(sys.argv if argv is None else argv)

    def relative(part: str) -> str:
        path = Path(part).absolute()
        return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else part

    parts = [relative(sys.executable), *([relative(argv[0])] if argv else []), *argv[1:]]
    if parts[0].startswith(".venv/") or Path(parts[0]).name.startswith("python"):
        parts[0] = ".venv/bin/python"  # the project's interpreter, as a user runs it (a GPU image's own included)
    return shlex.join(parts)


def results_dir() -> Path | None:
    """Where records go, or None when nothing is to be recorded (see the module docstring)."""
    chosen = os.environ.get("BENCH_RESULTS_DIR")
    if chosen is not None:
        return Path(chosen) if chosen else None
    if os.environ.get("PYTEST_CURRENT_TEST"):
        return None
    return RESULTS


def make_record(benchmark: str, result: dict[str, Any], argv: list[str] | None = None) -> dict[str, Any]:
    """The provenance fields, then the result's own (a result's own `date` or `benchmark` gives way to them)."""
    record: dict[str, Any] = {
        "benchmark": benchmark,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": commit(),
        "command": command_line(argv),
        "machine": machine(),
    }
    record.update({k: v for k, v in result.items() if k not in record})
    return record


def append(benchmark: str, record: dict[str, Any], directory: Path | None = None) -> Path | None:
    """Append one record to <directory>/<benchmark>.jsonl; returns the file, or None when not recording."""
    directory = results_dir() if directory is None else directory
    if directory is None:
        return None
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{benchmark}.jsonl"
    with path.open("a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")
    return path


def emit(benchmark: str, result: dict[str, Any]) -> dict[str, Any]:
    """Print the result's JSON line (as every script always has) and append its record; returns the record."""
    print(json.dumps(result), flush=True)
    record = make_record(benchmark, result)
    path = append(benchmark, record)
    if path is not None:
        print(f"{benchmark}: recorded in {os.path.relpath(path)}", file=sys.stderr)
    return record


def diagnostic(name: str, fn: Callable[..., Any], *args: Any) -> Any:
    """`fn(*args)`, or `{"error": ...}` where it raises: a section that explains the numbers (clocks, cores,
    start-up) must not cost the record the numbers themselves; the error goes to stderr, naming the section."""
    try:
        return fn(*args)
    except Exception as exc:  # noqa: BLE001 - any failure of a diagnostic is reported, not raised
        error = f"{type(exc).__name__}: {exc}"[:300]
        print(f"{name}: left out of the record ({error})", file=sys.stderr)
        return {"error": error}
