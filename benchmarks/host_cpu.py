"""Where a job's host CPU time goes while its rollouts run: each of its processes' cores, and their threads'.

vLLM's engine core is one Python thread that schedules, launches and reads back every engine step, so a decode
step of a small model costs CPU time, not GPU time. On an H100 the rollout's server stepped 1.2-3x slower per
token than the same vLLM offline (58270373a9cd, docs/guides/verl.md): either the engine core's thread got less
than a whole core (the job's other processes on the same cores: Ray's workers, the agent loops, the actor, the
tool servers) or its steps did more work. This sampler reads, every `interval` seconds, every process of the job
(those whose environment carries the job's mark: gpu_memory.job_processes) from /proc: CPU seconds, voluntary and
involuntary context switches, and each thread's CPU seconds; and the host's busy cores from /proc/stat, with the
share the hypervisor took for other machines (`host_steal_cores`). On an H200 (dccbb4f468e1, five launches) the
engine core kept a whole core through every measured rollout, 16-82 involuntary switches a second, with 3-4 of the
host's 16 cores busy: its steps are its own work, not a core shared with the job's other processes.

    with JobCpu(mark) as cpu:
        subprocess.run(job)
    cpu.write_timeline(run_dir / HOST_CPU_TIMELINE)
    window(samples, start_unix, end_unix)   # {"host_busy_cores": ..., "processes": [{"name", "cores", ...}]}

A process's `cores` in a window is its CPU seconds over the window's seconds: 1.0 is one core busy throughout.
`involuntary_per_s`: the times the kernel took a core from it while it could still run; a busy engine core
beside a high rate lost its core to another process. Linux only; elsewhere the sampler records nothing.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from benchmarks.gpu_memory import JOB_MARK_VAR, Sampler
from rl_factory.jsonl import read_records

TICK_S = 1.0 / os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 0.01
HOST_CPU_TIMELINE = "host_cpu.jsonl"  # a benchmark run's host CPU samples, in its run directory
TOP_PROCESSES = 16  # the busiest processes a window lists: a one-GPU job runs about 15 (Ray's, verl's, vLLM's)
TOP_THREADS = 4  # the busiest threads listed for each process that kept a core at least half busy
RECHECK_S = 1.0  # how long a process found without the job's mark is taken to be outside the job
# a process's threads are read where it used at least this share of a core since the sample before: the job's ~40
# processes hold ~2,000 threads (Ray's and torch's pools), and reading every one of them every 0.25 s wrote 15 MB
# over a 90-s job
THREADS_MIN_CORES = 0.2


def _stat_fields(text: str) -> list[str]:
    """/proc/<pid>/stat after the command name (which may hold spaces and parentheses): field 3 onwards."""
    return text[text.rindex(")") + 2:].split()


def _cpu_s(fields: list[str]) -> float:
    return (int(fields[11]) + int(fields[12])) * TICK_S  # utime, stime (stat fields 14 and 15)


def process_name(pid: int, proc: str = "/proc") -> str:
    """What a process calls itself: its command line's first word where a framework retitled it ("ray::TaskRunner",
    "VLLM::EngineCore"), else its executable and first argument."""
    try:
        raw = Path(f"{proc}/{pid}/cmdline").read_bytes()
    except OSError:
        return "?"
    words = [w.decode(errors="replace") for w in raw.split(b"\0") if w]
    if not words:
        return "?"
    if "::" in words[0]:  # setproctitle rewrites the whole line, spaces included
        return words[0].split(" ")[0][:60]
    return " ".join(Path(w).name if i == 0 else w for i, w in enumerate(words[:2]))[:60]


def read_process(pid: int, proc: str = "/proc", threads: bool = True) -> dict[str, Any] | None:
    """One process's CPU seconds, context switches and (`threads`) its threads' CPU seconds (None: gone)."""
    try:
        fields = _stat_fields(Path(f"{proc}/{pid}/stat").read_text())
        status = Path(f"{proc}/{pid}/status").read_text()
    except (OSError, ValueError):
        return None
    switches = {}
    for line in status.splitlines():
        key, _, value = line.partition(":")
        if key in ("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches"):
            switches[key.split("_")[0]] = int(value)
    out = {"cpu_s": round(_cpu_s(fields), 3), "voluntary": switches.get("voluntary", 0),
           "involuntary": switches.get("nonvoluntary", 0)}
    if threads:
        out["threads"] = {}
        try:
            for tid in os.listdir(f"{proc}/{pid}/task"):
                try:
                    text = Path(f"{proc}/{pid}/task/{tid}/stat").read_text()
                except OSError:
                    continue
                cpu = round(_cpu_s(_stat_fields(text)), 3)
                if cpu > 0:  # a pool's threads that never ran: missing reads as none, as it should
                    out["threads"][tid] = [text[text.index("(") + 1:text.rindex(")")], cpu]
        except OSError:
            pass
    return out


def host_seconds(proc: str = "/proc") -> tuple[float, float] | None:
    """The seconds all the host's cores were busy since boot, and of those the seconds the hypervisor ran something
    else on them (/proc/stat's cpu line: idle and iowait aside; `steal`). A virtual machine whose every step slows at
    once, vLLM's CPU-bound engine and the GPU's update alike, shows it here."""
    try:
        first = Path(f"{proc}/stat").read_text().splitlines()[0].split()
    except (OSError, IndexError):
        return None
    ticks = [int(x) for x in first[1:9]]  # user nice system idle iowait irq softirq steal
    return (sum(ticks) - ticks[3] - ticks[4]) * TICK_S, ticks[7] * TICK_S


class JobCpu(Sampler):
    """Samples the job's processes (found by their environment's mark) in a thread between __enter__ and __exit__."""

    def __init__(self, mark: str, interval: float = 0.25, proc: str = "/proc"):
        self.mark, self.interval, self.proc = mark, interval, proc
        self.timeline: list[dict[str, Any]] = []
        self._names: dict[int, str] = {}  # the job's pids seen so far, with their names
        self._cpu: dict[int, tuple[float, float]] = {}  # each one's CPU seconds at the sample before
        # pids seen without the mark, and when: a process between its fork and its exec still has its parent's
        # environment, so a pid found unmarked is read again after RECHECK_S
        self._others: dict[int, float] = {}

    def available(self) -> bool:
        return os.path.isdir(f"{self.proc}/self/task")

    def _job_pids(self) -> list[int]:
        needle = f"{JOB_MARK_VAR}={self.mark}".encode()
        live = {int(p) for p in os.listdir(self.proc) if p.isdigit()} - {os.getpid()}
        now = time.monotonic()
        for pid in live - set(self._names):
            if now - self._others.get(pid, -RECHECK_S) < RECHECK_S:
                continue
            try:
                marked = needle in Path(f"{self.proc}/{pid}/environ").read_bytes().split(b"\0")
            except OSError:
                marked = False  # gone, or not ours to read
            if marked:
                self._names[pid] = process_name(pid, self.proc)
                self._others.pop(pid, None)
            else:
                self._others[pid] = now
        self._others = {pid: t for pid, t in self._others.items() if pid in live}
        self._names = {pid: name for pid, name in self._names.items() if pid in live}  # a pid may be reused
        self._cpu = {pid: read for pid, read in self._cpu.items() if pid in live}
        return sorted(live & set(self._names))

    def sample(self) -> dict[str, Any]:
        began, now = time.perf_counter(), time.time()
        processes = {}
        for pid in self._job_pids():
            read = read_process(pid, self.proc, threads=False)
            if read is None:
                continue
            before = self._cpu.get(pid)  # (unix, cpu_s) at the sample before
            if before is not None and read["cpu_s"] - before[1] >= THREADS_MIN_CORES * (now - before[0]):
                read = read_process(pid, self.proc) or read
            self._cpu[pid] = (now, read["cpu_s"])
            # a process retitles itself after its start (Ray's workers, vLLM's engine core): read its name again
            name = process_name(pid, self.proc)
            self._names[pid] = name if name != "?" else self._names[pid]
            processes[str(pid)] = {"name": self._names[pid], **read}
        # read_s: what the sample itself took, the sampler's own load on the host
        busy, steal = host_seconds(self.proc) or (None, None)
        return {"unix": now, "host_busy_s": busy, "host_steal_s": steal, "processes": processes,
                "read_s": round(time.perf_counter() - began, 4)}

    def sample_once(self) -> None:
        self.timeline.append(self.sample())

    def write_timeline(self, path: Path) -> None:
        """Every sample, one JSON line each (a run directory's `host_cpu.jsonl`)."""
        if self.timeline:
            path.write_text("".join(json.dumps(s) + "\n" for s in self.timeline))


def read_timeline(path: Path) -> list[dict[str, Any]]:
    return read_records(path)


def window(samples: list[dict[str, Any]], start: float, end: float) -> dict[str, Any] | None:
    """Each process's cores and context switches per second between the first and the last sample inside
    [start, end] (all inside it, so a rollout's figures hold none of the update's or the sync's CPU time), the
    busiest first, with its busiest threads where it kept at least half a core; and the host's busy cores. None
    where fewer than two samples fall inside.

    A process is measured from the first sample inside that holds it: one found late (the sampler reads a new
    process's environment again only after RECHECK_S) had used CPU time before it was first read. Its threads are
    measured from the first sample inside that read them (the sampler reads a busy process's threads only); a thread
    missing from that sample was started after it, at no CPU time."""
    inside = [s for s in samples if start <= s["unix"] <= end]
    if len(inside) < 2 or inside[-1]["unix"] <= inside[0]["unix"]:
        return None
    first, last = inside[0], inside[-1]
    seconds = last["unix"] - first["unix"]
    rows = []
    for pid, now in last["processes"].items():
        since = next(s for s in inside if pid in s["processes"])
        if since is last:
            continue
        then, held = since["processes"][pid], last["unix"] - since["unix"]
        cores = (now["cpu_s"] - then["cpu_s"]) / held
        row = {"pid": int(pid), "name": now["name"], "cores": round(cores, 3),
               "voluntary_per_s": round((now["voluntary"] - then["voluntary"]) / held, 1),
               "involuntary_per_s": round((now["involuntary"] - then["involuntary"]) / held, 1)}
        # its threads, between the first sample inside that read them and the last, where both did
        read = next((s for s in inside if "threads" in s["processes"].get(pid, {})), None)
        if cores >= 0.5 and "threads" in now and read is not None and read is not last:
            before, span = read["processes"][pid]["threads"], last["unix"] - read["unix"]
            threads = [(name, (cpu - before.get(tid, [name, 0.0])[1]) / span)
                       for tid, (name, cpu) in now["threads"].items()]
            row["threads"] = [{"name": n, "cores": round(c, 3)}
                              for n, c in sorted(threads, key=lambda t: -t[1])[:TOP_THREADS]]
        rows.append(row)
    rows.sort(key=lambda r: -r["cores"])
    def cores(key: str) -> float | None:
        return (None if first.get(key) is None or last.get(key) is None
                else round((last[key] - first[key]) / seconds, 2))

    reads = sorted(s.get("read_s", 0.0) for s in inside)
    return {"seconds": round(seconds, 2), "host_busy_cores": cores("host_busy_s"),
            "host_steal_cores": cores("host_steal_s"), "sampler_read_s": reads[len(reads) // 2],
            "job_cores": round(sum(r["cores"] for r in rows), 2), "processes": rows[:TOP_PROCESSES]}


def rollout_windows(run_dir: Path, steps: list[int]) -> dict[int, tuple[float, float]]:
    """Each step's rollout in unix seconds: its first trajectory's start to its last one's return (our rollouts
    files' `started_unix` and `wall_s`); steps whose lines lack them are left out."""
    out = {}
    for step in steps:
        path = run_dir / "rollouts" / f"step_{step:06d}.jsonl"
        if not path.exists():
            continue
        timings = [r.get("timing") or {} for r in read_records(path)]
        spans = [(t["started_unix"], t["started_unix"] + t["wall_s"]) for t in timings
                 if "started_unix" in t and "wall_s" in t]
        if spans:
            out[step] = (min(s for s, _ in spans), max(e for _, e in spans))
    return out


def run_rollouts(run_dir: Path, steps: list[int]) -> dict[str, Any]:
    """`window` over each measured step's rollout, from a gpu_step run's samples ({} without them)."""
    samples = read_timeline(run_dir / HOST_CPU_TIMELINE)
    if not samples:
        return {}
    out = {}
    for step, (start, end) in rollout_windows(run_dir, steps).items():
        found = window(samples, start, end)
        if found is not None:
            out[str(step)] = found
    return out


def summary(per_step: dict[str, Any]) -> dict[str, Any] | None:
    """One line over `run_rollouts`' steps: the median over the rollouts of the host's busy and stolen cores and of
    each process name's cores (the processes of one name added up: a job runs several agent-loop workers)."""
    import statistics

    # a record whose section failed holds {"error": ...} there (benchmarks/record.py diagnostic): no rollouts
    per_step = {k: v for k, v in per_step.items() if isinstance(v, dict) and "processes" in v}
    if not per_step:
        return None
    names: dict[str, list[float]] = {}
    for step in per_step.values():
        totals: dict[str, float] = {}
        for row in step["processes"]:
            totals[row["name"]] = totals.get(row["name"], 0.0) + row["cores"]
        for name, cores in totals.items():
            names.setdefault(name, []).append(cores)

    def median(key: str) -> float | None:
        values = [s[key] for s in per_step.values() if s.get(key) is not None]
        return round(statistics.median(values), 2) if values else None

    return {"rollouts": len(per_step), "host_busy_cores": median("host_busy_cores"),
            "host_steal_cores": median("host_steal_cores"),
            # the busiest first by the number shown (the median), not by one rollout's peak
            "cores": dict(sorted(((n, round(statistics.median(v), 2)) for n, v in names.items()),
                                 key=lambda kv: -kv[1]))}
