"""Episode overhead: what opening and closing a trajectory's episode costs, and what it adds to a rollout.

Part 1, open + close latency (`envs.episode`), one episode at a time, `--episodes` of each kind:

  * handle     -- only shared servers, a hidden argument filled from the sample: an in-process handle,
                  nothing is started (every run pays this now: each trajectory has an episode)
  * session    -- `scope: episode` on a `url` server already running (benchmarks/servers/latency_server.py
                  over streamable HTTP): a new MCP session per episode, in the same server process
  * process    -- `scope: episode` on the stdio latency server: a new process per episode
  * pool       -- the same with `pool: 2`, measured when the pool is ready (its refill is not waited for
                  inside the timing: that is what a pool hides)

Close is timed as the rollout does it (`close(wait=False)`: slots freed, processes told to stop; they
exit in the background), and each episode starts on a quiet env (pools full, nothing exiting).

Part 2, rollout time: benchmarks/rollout.py's default workload (64 trajectories x 4 turns, the scripted
engine at 10 ms + 0.5 ms/token per turn, lognormal tool latency, mean 200 ms, log-sd 1.0, seeded) run
through `Agent.rollout_groups`, each trajectory in its own episode, against one shared latency server
(`shared`) and against a per-episode latency server with a warm pool as large as the batch (`pooled`,
pool full when the timing starts, as after the previous step's update; its replacements start as
episodes close, inside the timing). `overhead` = pooled / shared - 1, medians over `--repeats`
(alternating, each run on a quiet machine: pools full, nothing starting or exiting). Target: <= 0.05.

    .venv/bin/python benchmarks/episodes.py
    .venv/bin/python benchmarks/episodes.py --episodes 100 --repeats 5 --model-path <tokenizer dir>

Prints one JSON line: `open_close_ms` per kind (p50, p99, and for `pool` the share of pool hits), the
rollout times, `overhead`, and the load average before and after (2-core machines are noisy).
"""
from __future__ import annotations

import argparse
import asyncio
import os
import re
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from benchmarks.record import emit  # noqa: E402
os.environ.setdefault("OMP_NUM_THREADS", "1")

from benchmarks.rollout import ANSWER, SERVER, TOOL_CALL, draw_latencies, load_model  # noqa: E402
from envs import ToolEnv, get_parser  # noqa: E402
from rl_factory.chat import ChatFormat  # noqa: E402
from rl_factory.engines.base import SamplingParams  # noqa: E402
from rl_factory.engines.scripted import ScriptedEngine  # noqa: E402
from rl_factory.rollout import Agent, RolloutConfig  # noqa: E402
from rl_factory.types import ToolCall  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, default=40, help="part 1: episodes of each kind")
    parser.add_argument("--trajectories", type=int, default=64)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--tool-latency-ms", type=float, default=200.0)
    parser.add_argument("--sigma", type=float, default=1.0)
    parser.add_argument("--gen-ms", type=float, default=10.0)
    parser.add_argument("--gen-ms-per-token", type=float, default=0.5)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model-path", default=None, help="the tokenizer's directory (default: the embedded model)")
    args = parser.parse_args()
    args.engine = "scripted"
    emit("episodes", asyncio.run(run(args)))


def latency_entry(**knobs: Any) -> dict:
    return {"command": "python", "args": [str(SERVER)], "timeout_s": 600, "max_concurrency": 256, **knobs}


async def run(args: argparse.Namespace) -> dict[str, Any]:
    load_before = os.getloadavg()[0]
    tokenizer, _ = await load_model(args)
    port, http = start_http_server()
    try:
        kinds = {
            "handle": {"latency": latency_entry(hidden_arguments={"wait": {"seconds": "${sample.seconds}"}})},
            "session": {"latency": {"url": f"http://127.0.0.1:{port}/mcp", "scope": "episode"}},
            "process": {"latency": latency_entry(scope="episode")},
            "pool": {"latency": latency_entry(scope="episode", pool=2)},
        }
        open_close = {kind: await open_close_ms(manifest, args.episodes) for kind, manifest in kinds.items()}
    finally:
        http.terminate()
        http.wait(timeout=10)
    rollouts = await rollout_times(args, tokenizer)
    shared, pooled = (statistics.median(rollouts[k]) for k in ("shared", "pooled"))
    return {"open_close_ms": open_close, "rollout_s": {"shared": shared, "pooled": pooled},
            "overhead": pooled / shared - 1, "target": 0.05, "runs": rollouts,
            "trajectories": args.trajectories, "turns": args.turns, "tool_latency_ms": args.tool_latency_ms,
            "cpus": os.cpu_count(), "loadavg_1m": [load_before, os.getloadavg()[0]]}


def start_http_server() -> tuple[int, subprocess.Popen]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    proc = subprocess.Popen([sys.executable, str(SERVER), "--transport", "streamable-http", "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return port, proc
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("the HTTP latency server did not start")


async def quiet(envs: Any) -> None:
    """Wait until every pool is full and no instance is starting or still exiting."""
    def busy() -> bool:
        return any(e._closing or e._deferred or any(s._filling or len(s._ready) < s.spec.pool
                                                    for s in e._episode_servers) for e in envs)
    while busy():
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.5)  # the last exits' CPU


async def open_close_ms(manifest: dict, n: int) -> dict[str, float]:
    """p50 / p99 of one episode's open + close as a trajectory pays them, in ms (a call in between, not counted)."""
    async with ToolEnv.from_manifest({"mcpServers": manifest}) as env:
        await env.list_tools()
        (server,) = env._episode_servers or [None]
        times, hits = [], 0
        for i in range(n + 2):  # the first two warm up (imports, connections)
            await quiet([env])  # a pool is ready before it is asked: that is what it is for
            before = server.pool_hits if server is not None else 0
            t0 = time.perf_counter()
            episode = await env.open_episode({"seconds": 0.0})
            t1 = time.perf_counter()
            await episode.call(ToolCall("wait", {"seconds": 0.0}))
            t2 = time.perf_counter()
            await episode.close(wait=False)  # as the rollout closes it: its process exits in the background
            t3 = time.perf_counter()
            if i >= 2:
                times.append((t1 - t0 + t3 - t2) * 1e3)
                hits += (server.pool_hits if server is not None else 0) > before
    times.sort()
    out = {"p50": times[len(times) // 2], "p99": times[min(len(times) - 1, int(0.99 * len(times)))], "n": n}
    if manifest["latency"].get("pool"):
        out["pool_hit_rate"] = hits / n
    return out


async def rollout_times(args: argparse.Namespace, tokenizer: Any) -> dict[str, list[float]]:
    latencies = draw_latencies(args)
    samples = [{"messages": [{"role": "user", "content": f"What is {101 + i} * {7 + i % 13}?"}], "i": i}
               for i in range(args.trajectories)]
    cfg = RolloutConfig(max_turns=args.turns, max_response_tokens=256, max_total_tokens=1 << 20,
                        max_tool_response_tokens=64)
    question = re.compile(r"What is (\d+) \*")

    def script(prompt_ids: list[int], turn: int) -> str:  # trajectory i's turns, as in benchmarks/rollout.py
        i = int(question.search(tokenizer.decode(prompt_ids)).group(1)) - 101
        return TOOL_CALL.format(seconds=latencies[i][turn]) if turn < args.turns - 1 else ANSWER

    manifests = {"shared": latency_entry(), "pooled": latency_entry(scope="episode", pool=args.trajectories)}
    times: dict[str, list[float]] = {k: [] for k in manifests}
    envs = {k: ToolEnv.from_manifest({"mcpServers": {"latency": m}}) for k, m in manifests.items()}
    for env in envs.values():
        await env.__aenter__()
    try:
        for env in envs.values():
            await env.list_tools()
        fmt = ChatFormat(tokenizer, envs["shared"].tools)
        for _ in range(args.repeats):
            for kind, env in envs.items():
                # quiet: full pools (as after the previous step's update), nothing starting or exiting
                await quiet(envs.values())
                engine = ScriptedEngine(tokenizer, script, delay_s=args.gen_ms / 1e3,
                                        per_token_s=args.gen_ms_per_token / 1e3)
                agent = Agent(engine, env, fmt, get_parser("hermes"), cfg)
                t0 = time.perf_counter()
                groups = await agent.rollout_groups(samples, list(range(len(samples))), 1,
                                                    SamplingParams(0.0, 1.0, 256))
                times[kind].append(time.perf_counter() - t0)
                trajs = [g.trajectories[0] for g in groups]
                if not all(len(t.turns) == args.turns and all(r.ok for r in t.tool_results) for t in trajs):
                    raise RuntimeError(f"{kind}: a trajectory did not run as scripted")
    finally:
        for env in envs.values():
            await env.__aexit__(None, None, None)
    return times


if __name__ == "__main__":
    main()
