"""Start-up cost of one Python sandbox call, per isolation engine: `print(1)`, N calls one at a time.

Measures, beside each other in one run:

  * `bare`               -- the interpreter alone on the same runner (`python -I -c RUNNER`, no
                            isolation, no cgroups): the floor;
  * `process`            -- `run_code` in the weak mode (rlimits, a temporary directory, cgroups);
  * `namespaces_bwrap`   -- `run_code` in the default mode on bubblewrap (envs/servers/bwrap.py),
                            where `bwrap` is installed;
  * `namespaces_unshare` -- `run_code` in the default mode on the fallback engine
                            (envs/servers/isolation.py: unshare + a Python INIT).

Calls go round-robin over the engines, so a change in the machine's load hits each alike. Prints
one JSON line: per engine, the per-call latency p50/p95/mean in ms and the median CPU time a call
costs (`cpu_p50_ms`: this process and everything it started; unlike latency, it hardly moves with
the machine's load), and where it ran.

    .venv/bin/python benchmarks/sandbox.py --calls 50
"""
from __future__ import annotations

import argparse
import asyncio
import atexit
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.record import emit  # noqa: E402
from envs.servers.cgroups import RunCgroups  # noqa: E402
from envs.servers.probe import probe_namespaces  # noqa: E402
from envs.servers.python_sandbox import SandboxConfig, run_code  # noqa: E402
from envs.servers.runner import RUNNER  # noqa: E402

CODE = "print(1)"


class CpuMeter:
    """CPU seconds used by this process and everything it starts: what a call costs, whatever the load.

    A cgroup of our own (v1 `cpuacct`, or v2 `cpu.stat`) counts every descendant, reaped or not (a
    process in a pid namespace that bwrap never waits for); without one, getrusage counts only
    descendants that were waited for, which undercounts bwrap."""

    def __init__(self) -> None:
        self.source = "rusage"
        own = next((line.split(":", 2)[2].strip() for line in open("/proc/self/cgroup")
                    if line.split(":")[1] in ("cpuacct", "cpu,cpuacct")), None)
        if os.geteuid() == 0 and own is not None:
            for base in (f"/sys/fs/cgroup/cpuacct{own}", f"/sys/fs/cgroup/cpu,cpuacct{own}"):
                group = Path(base.rstrip("/"), f"rl_factory_bench_{os.getpid()}")
                try:
                    group.mkdir()
                    (group / "cgroup.procs").write_text(str(os.getpid()))
                except OSError:
                    continue
                self.usage, self.source = group / "cpuacct.usage", "cpuacct"
                atexit.register(_leave, group)
                break

    def __call__(self) -> float:
        if self.source == "cpuacct":
            return int(self.usage.read_text()) / 1e9
        own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _leave(group: Path) -> None:
    (group.parent / "cgroup.procs").write_text(str(os.getpid()))
    group.rmdir()


cpu_s = CpuMeter()


def time_subprocess(command: list[str], calls: int) -> list[tuple[float, float]]:
    times = []
    for _ in range(calls):
        start, cpu = time.perf_counter(), cpu_s()
        proc = subprocess.run(command, input=CODE.encode(), capture_output=True)
        times.append((time.perf_counter() - start, cpu_s() - cpu))
        if proc.returncode != 0 or proc.stdout.strip() != b"1":
            raise RuntimeError(f"{command[0]} failed: {proc.stderr.decode(errors='replace')[-500:]}")
    return times


async def time_run_code(cfg: SandboxConfig, calls: int) -> list[tuple[float, float]]:
    times = []
    for _ in range(calls):
        start, cpu = time.perf_counter(), cpu_s()
        result = await run_code(CODE, cfg)
        times.append((time.perf_counter() - start, cpu_s() - cpu))
        if result.stdout.strip() != "1":
            raise RuntimeError(f"{cfg.isolation} failed: {result.stderr[-500:]}")
    return times


def summary(times: list[tuple[float, float]]) -> dict[str, float]:
    ms = sorted(wall * 1000 for wall, _ in times)
    cpu = sorted(cpu * 1000 for _, cpu in times)
    return {"p50_ms": round(statistics.median(ms), 1), "p95_ms": round(ms[int(0.95 * (len(ms) - 1))], 1),
            "mean_ms": round(statistics.fmean(ms), 1), "cpu_p50_ms": round(statistics.median(cpu), 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=50, help="calls per engine (after 3 warm-up calls each)")
    args = parser.parse_args()
    load_start = os.getloadavg()[0]
    cgroup = RunCgroups.find()
    engines: dict[str, object] = {}
    bare = [sys.executable, "-I", "-B", "-u", "-c", RUNNER, json.dumps({"rlimits": {}, "socket_stub": False})]
    engines["bare"] = lambda n: time_subprocess(bare, n)
    configs = {"process": SandboxConfig(isolation="process", cgroup=cgroup)}
    for engine in ("bwrap", "unshare"):
        if probe_namespaces(engine=engine) is None:
            configs[f"namespaces_{engine}"] = SandboxConfig(engine=engine, cgroup=cgroup)
    for name, cfg in configs.items():
        engines[name] = lambda n, cfg=cfg: asyncio.run(time_run_code(cfg, n))
    for measure in engines.values():
        measure(3)  # warm-up
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in engines}
    for _ in range(args.calls):  # round-robin: a change in the machine's load hits every engine alike
        for name, measure in engines.items():
            times[name] += measure(1)
    results = {name: summary(values) for name, values in times.items()}
    version = subprocess.run(["bwrap", "--version"], capture_output=True, text=True).stdout.strip() \
        if shutil.which("bwrap") else None
    emit("sandbox", {"calls": args.calls, "engines": results,
                     "cgroups": sorted(cgroup.roots), "cpu_source": cpu_s.source, "bwrap": version,
                     "uid": os.geteuid(), "python": platform.python_version(), "cpu_count": os.cpu_count(),
                     "loadavg_1m": [round(load_start, 2), round(os.getloadavg()[0], 2)]})


if __name__ == "__main__":
    main()
