"""Tool-call throughput and overhead: many concurrent calls through `ToolEnv.call_batch`.

Starts benchmarks/servers/latency_server.py (an async tool that sleeps `--latency-s`) and
measures three ways of calling it, in one run:

  * steady  -- `--in-flight` workers, each issuing `--rounds` calls one after another with
               `call_batch([call])`; their starts are spread evenly over one latency so calls
               arrive as a rollout's do (each trajectory calls when its turn finishes).
               Ideal: in_flight / latency_s calls per second.
  * burst   -- `--rounds` times one `call_batch` of `--in-flight` calls issued at once (a
               lockstep rollout's tool phase). Ideal: each batch takes latency_s.
  * sequential -- `--sequential-calls` calls one at a time.

Prints one JSON line (see benchmarks/README.md for every field):

    .venv/bin/python benchmarks/tool_calls.py --in-flight 256 --latency-s 0.5 --rounds 10 --repeats 3
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from benchmarks.record import emit  # noqa: E402

from envs import ToolEnv, ToolLimits  # noqa: E402
from rl_factory.types import ToolCall, ToolResult  # noqa: E402
from tests.fakes.net import free_port, wait_for_port  # noqa: E402

SERVER = Path(__file__).resolve().parent / "servers" / "latency_server.py"
RUN_FIELDS = ["throughput_vs_ideal", "overhead_p50_ms", "net_overhead_p50_ms", "burst_wall_s_median"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--in-flight", type=int, default=256, help="concurrent calls")
    parser.add_argument("--latency-s", type=float, default=0.5, help="time the tool takes")
    parser.add_argument("--rounds", type=int, default=10, help="calls per steady worker; bursts")
    parser.add_argument("--sequential-calls", type=int, default=6)
    parser.add_argument("--transport", default="stdio", choices=["stdio", "streamable_http"])
    parser.add_argument("--repeats", type=int, default=3,
                        help="measure this many times on one server; report each field's median")
    parser.add_argument("--sdk-stdio-server", action="store_true",
                        help="serve stdio with the SDK's threaded transport, not envs.servers.stdio")
    args = parser.parse_args()
    emit("tool_calls", asyncio.run(run(args)))


async def run(args: argparse.Namespace) -> dict:
    load_before = os.getloadavg()[0]
    async with server_entry(args) as entry, ToolEnv.from_manifest(
            {"mcpServers": {"latency": entry}}, limits=ToolLimits(max_calls_per_turn=max(16, args.in_flight))) as env:
        await env.call_batch([ToolCall("wait", {"seconds": 0})] * min(args.in_flight, 64))  # warm up
        runs = [await measure(env, args) for _ in range(args.repeats)]
    return {
        "benchmark": "tool_calls",
        "transport": args.transport,
        "server_stdio": ("sdk" if args.sdk_stdio_server else "envs.servers.stdio")
                        if args.transport == "stdio" else None,
        "in_flight": args.in_flight,
        "latency_s": args.latency_s,
        "repeats": args.repeats,
        **{k: _median(r[k] for r in runs) for k in runs[0]},
        "runs": {k: [r[k] for r in runs] for k in RUN_FIELDS},
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "loadavg_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
    }


async def measure(env: ToolEnv, args: argparse.Namespace) -> dict:
    """One pass of the three phases; every field is a number."""
    call = ToolCall("wait", {"seconds": args.latency_s})
    env.reset_metrics()
    steady = await run_steady(env, call, args.in_flight, args.rounds, args.latency_s)
    burst = await run_burst(env, call, args.in_flight, args.rounds, args.latency_s)
    sequential = await run_sequential(env, call, args.sequential_calls, args.latency_s)
    metrics = env.metrics()
    calls = steady["calls"] + burst["calls"] + sequential["calls"]
    if metrics["tool/calls"] != calls:
        raise RuntimeError(f"ToolEnv counted {metrics['tool/calls']:g} calls, the benchmark made {calls}")
    return {
        **steady,
        "ideal_calls_per_s": round(args.in_flight / args.latency_s, 1),
        "throughput_vs_ideal": round(steady["calls_per_s"] * args.latency_s / args.in_flight, 3),
        **{f"burst_{k}": v for k, v in burst.items()},
        **{f"sequential_{k}": v for k, v in sequential.items()},
        "failed_calls": int(sum(v for k, v in metrics.items() if k.startswith("tool/errors/"))),
    }


async def run_steady(env: ToolEnv, call: ToolCall, in_flight: int, rounds: int,
                     latency_s: float) -> dict:
    """Keep `in_flight` calls outstanding; overhead is measured around each call_batch."""
    spacing = latency_s / in_flight
    overheads: list[float] = []
    waited: list[float] = []  # what the server's asyncio.sleep(latency_s) actually took

    async def worker(i: int) -> None:
        await asyncio.sleep(i * spacing)
        for _ in range(rounds):
            start = time.perf_counter()
            [result] = await env.call_batch([call])
            overheads.append(time.perf_counter() - start - latency_s)
            waited.append(_waited(result, latency_s))

    start = time.perf_counter()
    await asyncio.gather(*(worker(i) for i in range(in_flight)))
    wall = time.perf_counter() - start
    stagger = (in_flight - 1) * spacing  # deliberate idle start of the last worker
    calls = in_flight * rounds
    return {"calls": calls, "wall_s": round(wall, 3),
            "calls_per_s": round(calls / (wall - stagger), 1), **_overheads(overheads),
            "sleep_overshoot_p50_ms": _ms(statistics.median(w - latency_s for w in waited)),
            "net_overhead_p50_ms": _ms(statistics.median(o - (w - latency_s)
                                                         for o, w in zip(overheads, waited)))}


async def run_burst(env: ToolEnv, call: ToolCall, in_flight: int, rounds: int,
                    latency_s: float) -> dict:
    """`rounds` times: one call_batch of `in_flight` calls; per-call latency is ToolResult.latency_s."""
    walls, overheads = [], []
    for _ in range(rounds):
        start = time.perf_counter()
        results = await env.call_batch([call] * in_flight)
        walls.append(time.perf_counter() - start)
        overheads += [r.latency_s - latency_s for r in results]
    return {"calls": in_flight * rounds, "wall_s_median": round(statistics.median(walls), 3),
            "calls_per_s": round(in_flight * rounds / sum(walls), 1), **_overheads(overheads)}


async def run_sequential(env: ToolEnv, call: ToolCall, n: int, latency_s: float) -> dict:
    overheads = []
    start = time.perf_counter()
    for _ in range(n):
        t = time.perf_counter()
        await env.call_batch([call])
        overheads.append(time.perf_counter() - t - latency_s)
    wall = time.perf_counter() - start
    return {"calls": n, "calls_per_s": round(n / wall, 2),
            "overhead_p50_ms": _ms(statistics.median(overheads))}


def _waited(result: ToolResult, latency_s: float) -> float:
    if not result.ok:
        return latency_s  # counted in failed_calls; keeps the overhead statistics defined
    return float(result.text)


def _overheads(seconds: list[float]) -> dict:
    ordered = sorted(seconds)
    return {"overhead_p50_ms": _ms(statistics.median(ordered)),
            "overhead_p99_ms": _ms(ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))])}


def _median(values) -> float:
    values = list(values)
    if all(isinstance(v, int) for v in values):
        return statistics.median_low(values)
    return round(statistics.median(values), 3)


def _ms(seconds: float) -> float:
    return round(seconds * 1e3, 2)


@contextlib.asynccontextmanager
async def server_entry(args: argparse.Namespace) -> AsyncIterator[dict]:
    """The manifest entry for the latency server; over HTTP, the server process runs meanwhile."""
    knobs = {"timeout_s": args.latency_s + 60, "max_concurrency": args.in_flight}
    if args.transport == "stdio":
        flags = ["--sdk-stdio"] if args.sdk_stdio_server else []
        yield {"command": "python", "args": [str(SERVER), *flags], **knobs}
        return
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(SERVER), "--transport", "streamable-http",
                             "--port", str(port)], stderr=subprocess.DEVNULL)
    try:
        await wait_for_port(port)
        yield {"url": f"http://127.0.0.1:{port}/mcp", **knobs}
    finally:
        proc.terminate()
        proc.wait(10)


if __name__ == "__main__":
    main()
