"""Start-up cost of one Python sandbox call, per isolation engine: `print(1)`, N calls one at a time.

Measures, beside each other in one run:

  * `bare`       -- the interpreter alone (`python -I -c ...`, no isolation): the floor;
  * `process`    -- `run_code` in the weak mode (rlimits, a temporary directory, per-run cgroups);
  * `namespaces` -- `run_code` in the default mode (envs/servers/isolation.py: unshare + INIT);
  * `bwrap`      -- bubblewrap (where `bwrap` is on PATH) building the same view (the interpreter,
                    /usr, private /tmp, minimal /dev, own /proc; all namespaces) and running the same
                    runner: the engine the sandbox was weighed against (docs/security.md says why it
                    is not used).

Prints one JSON line: per-call latency p50/p95/mean in ms per engine, and where it ran.

    .venv/bin/python benchmarks/sandbox.py --calls 50
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from envs.servers.cgroups import RunCgroups  # noqa: E402
from envs.servers.isolation import probe_namespaces  # noqa: E402
from envs.servers.python_sandbox import RUNNER, SandboxConfig, _child_env, run_code  # noqa: E402

CODE = "print(1)"


def bwrap_command(cfg: SandboxConfig) -> list[str]:
    view = []
    for path in sorted(set(cfg.view())):
        if os.path.islink(path):
            view += ["--symlink", os.readlink(path), path]
        elif os.path.exists(path):
            view += ["--ro-bind", path, path]
    runner = [cfg.python, "-I", "-B", "-u", "-c", RUNNER, json.dumps({"rlimits": cfg.rlimits(), "socket_stub": False})]
    env = [arg for key, value in _child_env("/tmp").items() for arg in ("--setenv", key, value)]
    return ["bwrap", "--unshare-all", "--unshare-user", "--uid", "65534", "--gid", "65534", "--die-with-parent",
            "--new-session", "--cap-drop", "ALL", *view, "--dev", "/dev", "--proc", "/proc",
            "--size", str(cfg.tmp_mb << 20), "--tmpfs", "/tmp", "--chdir", "/tmp", "--clearenv", *env, "--", *runner]


def time_subprocess(command: list[str], calls: int) -> list[float]:
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        proc = subprocess.run(command, input=CODE.encode(), capture_output=True)
        times.append(time.perf_counter() - start)
        if proc.returncode != 0 or proc.stdout.strip() != b"1":
            raise RuntimeError(f"{command[0]} failed: {proc.stderr.decode(errors='replace')[-500:]}")
    return times


async def time_run_code(cfg: SandboxConfig, calls: int) -> list[float]:
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        result = await run_code(CODE, cfg)
        times.append(time.perf_counter() - start)
        if result.stdout.strip() != "1":
            raise RuntimeError(f"{cfg.isolation} failed: {result.stderr[-500:]}")
    return times


def summary(times: list[float]) -> dict[str, float]:
    ms = sorted(t * 1000 for t in times)
    return {"p50_ms": round(statistics.median(ms), 1), "p95_ms": round(ms[int(0.95 * (len(ms) - 1))], 1),
            "mean_ms": round(statistics.fmean(ms), 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=50, help="calls per engine (after 3 warm-up calls)")
    args = parser.parse_args()
    load_start = os.getloadavg()[0]
    cgroup = RunCgroups.find()
    engines: dict[str, object] = {}
    bare = [sys.executable, "-I", "-B", "-u", "-c", RUNNER, json.dumps({"rlimits": {}, "socket_stub": False})]
    engines["bare"] = lambda n: time_subprocess(bare, n)
    for mode in ("process", "namespaces"):
        if mode == "namespaces" and probe_namespaces() is not None:
            continue
        cfg = SandboxConfig(isolation=mode, cgroup=cgroup)
        engines[mode] = lambda n, cfg=cfg: asyncio.run(time_run_code(cfg, n))
    if shutil.which("bwrap"):
        command = bwrap_command(SandboxConfig(cgroup=cgroup))
        engines["bwrap"] = lambda n: time_subprocess(command, n)
    results = {}
    for name, measure in engines.items():
        measure(3)
        results[name] = summary(measure(args.calls))
    version = subprocess.run(["bwrap", "--version"], capture_output=True, text=True).stdout.strip() \
        if shutil.which("bwrap") else None
    print(json.dumps({"benchmark": "sandbox", "calls": args.calls, "engines": results,
                      "cgroups": sorted(cgroup.roots), "bwrap": version, "uid": os.geteuid(),
                      "python": platform.python_version(), "cpu_count": os.cpu_count(),
                      "loadavg_1m": [round(load_start, 2), round(os.getloadavg()[0], 2)]}))


if __name__ == "__main__":
    main()
