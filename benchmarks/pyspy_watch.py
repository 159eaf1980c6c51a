"""Sample where a running verl job's processes spend a few steady steps, with py-spy.

    python benchmarks/pyspy_watch.py --runs outputs/gpu_suite --after-step 2 --seconds 15 --out outputs/gpu_suite/pyspy &
    python benchmarks/gpu_step.py --shape qwen3-0.6b --steps 6 --no-ceilings --out outputs/gpu_suite

It waits for a run directory under `--runs` made after it started whose metrics.jsonl has reached
`--after-step` (step 1 compiles and captures graphs), then records `--seconds` of stacks (wall time, idle
threads included, each stack under its thread) from each of verl's processes at once: the FSDP actor
(`WorkerDict`), the trainer (`TaskRunner`), vLLM's server frontend (`vLLMHttpServer`) and engine core
(`EngineCore`), and one agent-loop worker. Each profile is written as collapsed stacks (`<role>-<pid>.txt`,
flamegraph input), and one JSON line gives each process's most frequent innermost frames, and each thread's:
what the GPU phases wait on (Python between kernels, TransferQueue copies, CUDA synchronization) is read from
these.
Needs py-spy (`pip install py-spy`; on the lent GPU machine it travels in `.whl/`).
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.record import emit  # noqa: E402
from rl_factory.jsonl import read_records  # noqa: E402

ROLES = ("WorkerDict", "TaskRunner", "vLLMHttpServer", "EngineCore", "AgentLoopWorker")


def processes() -> dict[str, int]:
    """role -> pid of the first live process whose command line names it."""
    found: dict[str, int] = {}
    for proc in sorted(Path("/proc").glob("[0-9]*"), key=lambda p: int(p.name)):
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        for role in ROLES:
            if role not in found and role in cmdline and "pyspy_watch" not in cmdline:
                found[role] = int(proc.name)
    return found


def wait_for_step(runs: Path, since: float, step: int, timeout: float) -> Path | None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        for metrics in runs.glob("*/metrics.jsonl"):
            if metrics.stat().st_mtime < since:
                continue
            lines = read_records(metrics, torn_ok=True)  # the job may be mid-line
            if any(m.get("step", 0) >= step for m in lines):
                return metrics.parent
        time.sleep(1)
    return None


def py_spy() -> str | None:
    """py-spy's executable: on the PATH, or beside this Python (a virtual environment not activated)."""
    beside = Path(sys.executable).with_name("py-spy")
    return shutil.which("py-spy") or (str(beside) if beside.exists() else None)


def record_command(pid: int, path: Path, seconds: float | None = None) -> list[str]:
    """py-spy recording a process's stacks by thread, idle ones too, without pausing it, into `path` (raw collapsed
    stacks); for `seconds`, or until interrupted (SIGINT: py-spy then writes what it has)."""
    timing = ["--duration", str(int(seconds))] if seconds else []
    return [py_spy() or "py-spy", "record", "--pid", str(pid), *timing, "--rate", "100", "--idle", "--threads",
            "--nonblocking", "--format", "raw", "--output", str(path)]


def children_titled(title: str) -> list[int]:
    """The pids of this process's children whose command line names `title` (vLLM titles its engine core
    VLLM::EngineCore)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            cmdline = (stat.parent / "cmdline").read_bytes()
        except (OSError, IndexError, ValueError):
            continue
        if ppid == os.getpid() and title.encode() in cmdline:
            found.append(int(stat.parent.name))
    return found


@contextlib.contextmanager
def recording(out: Path | None, pids: list[int], role: str = "EngineCore"):
    """py-spy on each of `pids` while the block runs, its collapsed stacks in `out` (`<role>-<pid>.txt`), each
    profile's summary (top_frames) set in the dict yielded once the block ends. Nothing where `out` is None."""
    summary: dict = {}
    if out is None:
        yield summary
        return
    out.mkdir(parents=True, exist_ok=True)
    paths = {pid: out / f"{role}-{pid}.txt" for pid in pids}
    recorders = {pid: subprocess.Popen(record_command(pid, path), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                       text=True) for pid, path in paths.items()}
    try:
        yield summary
    finally:
        for pid, proc in recorders.items():  # py-spy writes its profile when interrupted
            proc.send_signal(signal.SIGINT)
            _, err = proc.communicate(timeout=60)
            summary[str(pid)] = top_frames(paths[pid]) if paths[pid].exists() else {"error": err[-500:]}


def top_frames(path: Path, n: int = 12, per_thread: int = 5) -> dict:
    """The innermost frames that hold the most samples, and the total (py-spy raw: 'a;b;c count'). Recorded with
    `--threads`, each stack starts with its thread ('thread (TID): NAME'): `threads` then gives each thread's share
    of the samples and its own most frequent innermost frames, so that a process's main loop is told apart from
    its helper threads (vLLM's engine core: the busy loop, and the threads that move requests and outputs)."""
    inner, total = collections.Counter(), 0
    threads: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        frames = [f.strip() for f in stack.split(";")]
        total += int(count)
        inner[frames[-1]] += int(count)
        if frames[0].startswith("thread ("):
            name = frames[0].split(": ", 1)[-1]  # the name py-spy gives a thread (its id changes each launch)
            threads[name][frames[-1] if len(frames) > 1 else "(no Python frame)"] += int(count)
    out = {"samples": total, "top": [[frame, round(c / max(1, total), 3)] for frame, c in inner.most_common(n)]}
    by_size = sorted(threads.items(), key=lambda kv: -sum(kv[1].values()))
    if by_size:
        out["threads"] = {name: {"share": round(sum(c.values()) / max(1, total), 3),
                                 "top": [[f, round(k / sum(c.values()), 3)] for f, k in c.most_common(per_thread)]}
                          for name, c in by_size}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", default="outputs/gpu_suite")
    ap.add_argument("--after-step", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=15)
    ap.add_argument("--timeout", type=float, default=560)
    ap.add_argument("--out", default="outputs/gpu_suite/pyspy")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    run = wait_for_step(Path(args.runs), time.time(), args.after_step, args.timeout)
    if run is None:
        sys.exit(f"pyspy_watch: no run under {args.runs} reached step {args.after_step}")
    found = processes()
    recorders = {role: subprocess.Popen(record_command(pid, out / f"{role}-{pid}.txt", args.seconds),
                                        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
                 for role, pid in found.items()}
    result = {"bench": "pyspy", "run": str(run), "seconds": args.seconds, "pids": found, "profiles": {}}
    for role, proc in recorders.items():
        _, err = proc.communicate(timeout=args.seconds + 60)
        path = out / f"{role}-{found[role]}.txt"
        result["profiles"][role] = top_frames(path) if path.exists() else {"error": err[-500:]}
    emit("pyspy", result)


if __name__ == "__main__":
    main()
