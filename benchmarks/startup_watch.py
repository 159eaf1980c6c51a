"""Where a verl launch's processes are before its first step: py-spy stacks sampled through start-up.

    python benchmarks/startup_watch.py --runs outputs/gpu_suite --out outputs/gpu_suite/startup-stacks &
    python benchmarks/gpu_step.py --shape qwen3-0.6b --steps 2 --no-ceilings --out outputs/gpu_suite

startup.json (rl_factory/backends/verl/startup.py) says how long each start-up phase took; this says what ran
in it. Every `--interval` seconds it takes one `py-spy dump` of each process of the job: the launcher
(`rl_factory.cli`) and each Ray worker process (`ray::TaskRunner`, `ray::WorkerDict`, vLLM's server and engine
core, TransferQueue's controller and storage units, the agent-loop and reward workers, and `ray::IDLE` workers,
whose samples are filed under the actor each becomes: a worker's start and its actor class's imports run before
it takes the actor's name). It stops once a run directory under `--runs` made after it started has logged step 1
(or at `--timeout`, or SIGTERM), files each sample under the phase its time falls in (that run's startup.json
marks), and prints one JSON line: per phase, per process, the stacks seen most often (each sample's busiest
thread, innermost frames first) with how many samples each holds, and the innermost frame of our code, verl's,
vLLM's, TransferQueue's, transformers' or Ray's each sample is in (`where`: below library internals, what the
phase is spent on). The samples themselves are kept in `<out>/samples.jsonl`. Needs py-spy (on the lent GPU
machine it travels with the verl stack).
"""
from __future__ import annotations

import argparse
import collections
import concurrent.futures
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.record import emit  # noqa: E402
from rl_factory.backends.verl.startup import EVENTS  # noqa: E402  (imports neither verl nor Ray)

FRAMES = 4  # innermost frames that name a stack: enough to tell a lock wait from a compile from an import
# the code a start-up phase is spent in: a sample is also filed under its innermost frame from one of these
PACKAGES = ("/rl_factory/", "/verl/", "/vllm/", "/transfer_queue/", "/transformers/", "/ray/")


def job_processes() -> dict[int, str]:
    """pid -> role for the launcher and every Ray worker process (a Ray worker's title is `ray::<Actor>...`)."""
    found = {}
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        first = argv[0].decode(errors="replace")
        if first.startswith("ray::"):  # ray::IDLE: a worker process before its actor's constructor runs
            found[int(proc.name)] = first[5:].split()[0].split(".")[0] or "ray"
        elif b"rl_factory.cli" in argv:
            found[int(proc.name)] = "launcher"
        elif first.startswith("VLLM::") or b"EngineCore" in argv[0]:
            found[int(proc.name)] = first.split()[0]
    return found


def dump(pid: int) -> list[dict] | None:
    try:
        done = subprocess.run(["py-spy", "dump", "--pid", str(pid), "--json", "--nonblocking"],
                              capture_output=True, text=True, timeout=20)
        return json.loads(done.stdout) if done.returncode == 0 else None
    except (subprocess.TimeoutExpired, json.JSONDecodeError, OSError):
        return None


def frame_text(frame: dict) -> str:
    return f"{frame.get('name')} ({frame.get('short_filename') or frame.get('filename')}:{frame.get('line')})"


def busiest_frames(threads: list[dict]) -> list[dict]:
    """The frames (innermost first) of the thread that holds the GIL, else of one that runs, else the main one."""
    def rank(thread: dict) -> tuple:
        return (thread.get("owns_gil", False), thread.get("active", False),
                thread.get("thread_name") == "MainThread", len(thread.get("frames", [])))
    best = max(threads, key=rank, default=None)
    return (best or {}).get("frames") or []


def where(frames: list[dict]) -> str:
    """The innermost frame in one of PACKAGES: the code the sample is spent in, below library internals."""
    for frame in frames:
        if any(pkg in (frame.get("filename") or "") for pkg in PACKAGES):
            return frame_text(frame)
    return frame_text(frames[0]) if frames else "(no frames)"


def started_run(runs: Path, since: float) -> Path | None:
    """The newest run directory under `runs` (at any depth) whose startup.json appeared after `since`."""
    fresh = [p for p in runs.glob("**/startup.json") if p.stat().st_mtime >= since]
    return max(fresh, key=lambda p: p.stat().st_mtime).parent if fresh else None


def logged_step_one(run: Path | None) -> bool:
    try:
        return json.loads((run / "startup.json").read_text()).get("complete", False) if run else False
    except (OSError, json.JSONDecodeError):
        return False


def phase_at(t: float, marks: dict[str, float]) -> str:
    """The phase running at time t: the one that ends with the first mark after t."""
    for event, when in sorted(marks.items(), key=lambda kv: kv[1]):
        if when >= t:
            return EVENTS.get(event) or event
    return "after_last_mark"


def final_roles(samples: list[dict]) -> dict[int, str]:
    """pid -> the role its last sample had: a Ray worker is `IDLE` until its actor's constructor runs (its
    process start and the imports of the actor's class happen before), then it takes the actor's name."""
    return {sample["pid"]: sample["role"] for sample in samples}


def summarize(samples: list[dict], marks: dict[str, float], top: int) -> dict:
    """phase -> process role -> its sample count, the places its samples are in most often (`where`) and its
    most frequent innermost stacks. A Ray worker's samples from before its actor started are filed under
    `<actor> (starting)`; a worker that never became an actor stays `IDLE`."""
    roles_of = final_roles(samples)
    by_phase: dict[str, dict[str, tuple[collections.Counter, collections.Counter]]] = {}
    for sample in samples:
        roles = by_phase.setdefault(phase_at(sample["t"], marks), {})
        role = sample["role"]
        if role == "IDLE" and roles_of.get(sample["pid"], "IDLE") != "IDLE":
            role = f"{roles_of[sample['pid']]} (starting)"
        places, stacks = roles.setdefault(role, (collections.Counter(), collections.Counter()))
        places[sample["where"]] += 1
        stacks[" < ".join(sample["stack"][:FRAMES])] += 1
    return {phase: {role: {"samples": sum(places.values()),
                           "where": [[place, n] for place, n in places.most_common(top)],
                           "stacks": [[stack, n] for stack, n in stacks.most_common(top)]}
                    for role, (places, stacks) in sorted(roles.items())}
            for phase, roles in by_phase.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", default="outputs/gpu_suite", help="where the job's run directory will appear")
    ap.add_argument("--interval", type=float, default=2.0, help="seconds between two rounds of dumps")
    ap.add_argument("--timeout", type=float, default=580)
    ap.add_argument("--top", type=int, default=3, help="stacks kept per phase and process")
    ap.add_argument("--out", default="outputs/gpu_suite/startup-stacks")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    since, deadline = time.time(), time.time() + args.timeout
    samples, run = [], None
    stop = []  # SIGTERM (the launch ended before its first step): summarize what was sampled
    signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
    with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool, open(out / "samples.jsonl", "w") as keep:
        while time.time() < deadline and not stop and not logged_step_one(run):
            tick = time.time()
            procs = job_processes()
            for (pid, role), threads in zip(procs.items(), pool.map(dump, procs)):
                if threads:
                    frames = busiest_frames(threads)
                    sample = {"t": round(tick, 2), "role": role, "pid": pid, "where": where(frames),
                              "stack": [frame_text(f) for f in frames[:40]]}
                    samples.append(sample)
                    keep.write(json.dumps(sample) + "\n")
            keep.flush()
            run = run or started_run(Path(args.runs), since)
            if not stop:
                time.sleep(max(0.0, args.interval - (time.time() - tick)))
    marks = {}
    if run is not None:
        try:
            marks = json.loads((run / "startup.json").read_text()).get("marks", {})
        except (OSError, json.JSONDecodeError):
            pass
    emit("startup_stacks", {"run": str(run), "interval_s": args.interval, "samples": len(samples),
                            "complete": logged_step_one(run), "phases": summarize(samples, marks, args.top)})


if __name__ == "__main__":
    main()
