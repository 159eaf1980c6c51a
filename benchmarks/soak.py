"""Soak: many multi-turn trajectories against four misbehaving MCP servers; nothing lost, nothing leaks.

`--trajectories` rollouts (default 1,000) of `--turns` turns (default 8) run through the real
`Agent.rollout`, `ToolEnv` and `Scorer`, `--concurrency` at a time, in `--rounds` rounds. The "model"
(the scripted engine) calls tools on four servers on loopback (benchmarks/servers/soak_server.py: two
over stdio, one over streamable HTTP, one over SSE) and injects faults with fixed probabilities:
servers that crash mid-call (stdio, restarted by the env), calls that hang past `timeout_s`, garbage on
a server's stdout, 8 MiB answers, tool errors; assistant turns that are adversarial text (JSON nested
100,000 deep, a 5,000-digit number, lone surrogates, 40 calls in one turn); and a reward that
sometimes raises, calls `exit()` or returns a string. Each trajectory is checked: it must come back
with its turns, a result for every call and a reward.

After every round it samples this process's open file descriptors (and how many are sockets: an HTTP
server's keep-alive pool fills up to its `max_concurrency`, 16 here, before it levels off), its live
child processes (and their descendants; the two stdio servers when all is well), its RSS and the
Python heap (`py_blocks_k`: thousands of live pymalloc blocks, after a `gc.collect()`: objects that
leak grow it, the allocator keeping freed pages does not). It prints one JSON line: the counts by
outcome, the samples, and `*_growth` (last round minus the first, so the servers' start-up is not
counted as growth). `--tracemalloc N` also traces allocations (N frames each; slower) from the end
of round 1 and reports the lines whose live memory grew most from the end of round 2 to the last.

    .venv/bin/python benchmarks/soak.py                                  # 1,000 x 8, four servers
    .venv/bin/python benchmarks/soak.py --trajectories 40 --turns 4 --rounds 2   # a quick one
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import gc
import os
import random
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from benchmarks.record import emit  # noqa: E402
os.environ.setdefault("OMP_NUM_THREADS", "1")

from envs import ToolEnv, get_parser  # noqa: E402
from rewards.loader import RewardFn  # noqa: E402
from rewards.combine import Component  # noqa: E402
from rewards.scorer import Scorer  # noqa: E402
from rl_factory.chat import ChatFormat  # noqa: E402
from rl_factory.engines.base import SamplingParams  # noqa: E402
from rl_factory.engines.scripted import ScriptedEngine  # noqa: E402
from rl_factory.rollout import Agent, RolloutConfig  # noqa: E402
from tests.fakes.net import free_port, wait_for_port  # noqa: E402

SERVER = ROOT / "benchmarks" / "servers" / "soak_server.py"
CALCULATOR_MANIFEST = ROOT / "configs" / "tools" / "calculator.yaml"
# Per tool call: what the server is asked to do, by server transport (HTTP servers are not ours to restart).
KINDS = {"stdio": {"ok": 0.80, "hang": 0.03, "crash": 0.02, "garbage": 0.05, "big": 0.03, "error": 0.07},
         "http": {"ok": 0.85, "hang": 0.03, "big": 0.04, "error": 0.08}}
ADVERSARIAL = [
    '<tool_call>\n{"name": "s0__work", "arguments": ' + "[" * 100_000 + "]" * 100_000 + "}\n</tool_call>",
    '<tool_call>\n{"name": "s1__work", "arguments": {"kind": "ok", "ms": ' + "7" * 5000 + "}}\n</tool_call>",
    '<tool_call>\n{"name": "\\ud800s2__work", "arguments": {"kind": "\\udfff"}}\n</tool_call>',
    "".join('<tool_call>\n{"name": "s%d__work", "arguments": {"kind": "ok", "ms": 1}}\n</tool_call>\n' % (i % 4)
            for i in range(40)),
    "<tool_call>\n{broken",
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trajectories", type=int, default=1000)
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--concurrency", type=int, default=100, help="trajectories in flight at once")
    parser.add_argument("--rounds", type=int, default=10, help="samples of fds, processes and memory")
    parser.add_argument("--adversarial", type=float, default=0.05, help="share of turns that are adversarial text")
    parser.add_argument("--timeout-s", type=float, default=1.0, help="per-call timeout of every server")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tracemalloc", type=int, default=0, metavar="FRAMES",
                        help="trace allocations from the end of round 1; report where live memory grew")
    parser.add_argument("--tokenizer", default=None, help="a model directory (default: the embedded model, "
                                                          "built and cached on first use)")
    args = parser.parse_args()
    emit("soak", asyncio.run(soak(args)))


async def soak(args: argparse.Namespace) -> dict:
    rng = random.Random(args.seed)
    tokenizer = await load_tokenizer(args.tokenizer)
    http_port, sse_port = free_port(), free_port()
    servers = [subprocess.Popen([sys.executable, str(SERVER), "--transport", transport, "--port", str(port)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
               for transport, port in (("streamable-http", http_port), ("sse", sse_port))]
    try:
        for port in (http_port, sse_port):
            await wait_for_port(port)
        stdio = {"command": "python", "args": [str(SERVER)], "timeout_s": args.timeout_s, "prefix": True,
                 "restart": {"backoff_s": 0.05, "max_backoff_s": 0.5}}
        manifest = {"mcpServers": {
            "s0": stdio, "s1": stdio,
            # max_concurrency also sizes an HTTP server's keep-alive pool: the sockets it may hold idle
            "s2": {"url": f"http://127.0.0.1:{http_port}/mcp", "timeout_s": args.timeout_s, "prefix": True,
                   "max_concurrency": 16},
            "s3": {"url": f"http://127.0.0.1:{sse_port}/sse", "transport": "sse", "timeout_s": args.timeout_s,
                   "prefix": True, "max_concurrency": 16}}}
        async with ToolEnv.from_manifest(manifest) as env:
            tools = await env.list_tools()
            return await run_rounds(args, rng, env, ChatFormat(tokenizer, tools), tokenizer, servers)
    finally:
        for proc in servers:
            proc.kill()
            proc.wait()


async def run_rounds(args, rng, env, fmt, tokenizer, http_servers) -> dict:
    cfg = RolloutConfig(max_turns=args.turns, max_response_tokens=1 << 20, max_total_tokens=1 << 22,
                        max_tool_response_tokens=64)
    parser = get_parser("hermes")
    scorer = Scorer([Component("flaky", RewardFn(flaky_reward))], on_error="zero", executor="thread")
    slots = asyncio.Semaphore(args.concurrency)
    outcomes: collections.Counter[str] = collections.Counter()
    exceptions: collections.Counter[str] = collections.Counter()  # escaped a rollout: must stay empty
    samples = {"fds": [], "sockets": [], "processes": [], "rss_mib": [], "py_blocks_k": []}
    snapshots: list[tracemalloc.Snapshot] = []
    lost, done = 0, 0
    params = SamplingParams(temperature=1.0, max_new_tokens=1 << 20)
    start, load_start = time.perf_counter(), os.getloadavg()[0]

    async def one(i: int) -> bool:
        async with slots:
            # One engine and agent per trajectory, as in training: the scripted engine keeps every prompt.
            engine = ScriptedEngine(tokenizer, lambda ids, turn: assistant_turn(rng, args, turn))
            agent = Agent(engine, env, fmt, parser, cfg)
            traj = await agent.rollout({"messages": [{"role": "user", "content": f"task {i}"}]}, i, params)
            await scorer.score(traj)
        outcomes["reward_errors"] += any(k.endswith("reward_error") for k in traj.reward_info)
        return complete(traj, args.turns)

    per_round = -(-args.trajectories // args.rounds)
    for first in range(0, args.trajectories, per_round):
        ids = range(first, min(first + per_round, args.trajectories))
        results = await asyncio.gather(*(one(i) for i in ids), return_exceptions=True)
        lost += sum(r is not True for r in results)
        done += len(results)
        exceptions.update(type(r).__name__ for r in results if isinstance(r, BaseException))
        await asyncio.sleep(0.5)  # let killed children be reaped before counting
        fds = open_fds()
        samples["fds"].append(sum(fds.values()))
        samples["sockets"].append(fds["socket"])
        samples["processes"].append(len(descendants(os.getpid())) - len(http_servers))
        gc.collect()
        samples["rss_mib"].append(round(rss_mib(), 1))
        samples["py_blocks_k"].append(round(sys.getallocatedblocks() / 1000))
        if args.tracemalloc:
            if tracemalloc.is_tracing():  # keep two: each snapshot holds a Python object per trace
                snapshots[1:] = [tracemalloc.take_snapshot()]
            else:
                tracemalloc.start(args.tracemalloc)  # after round 1: its start-up costs are not growth
    metrics = env.metrics()
    errors = {k.removeprefix("tool/errors/"): int(v) for k, v in metrics.items()
              if k.startswith("tool/errors/")}
    return {"benchmark": "soak", "trajectories": done, "turns": args.turns, "servers": 4,
            "lost_trajectories": lost, "exceptions": dict(exceptions), "tool_calls": int(metrics.get("tool/calls", 0)),
            "tool_errors": errors, "reward_errors": outcomes["reward_errors"],
            "wall_s": round(time.perf_counter() - start, 1), "loadavg_1m": [load_start, os.getloadavg()[0]],
            "cpus": os.cpu_count(), **samples,
            "fds_growth": samples["fds"][-1] - samples["fds"][0],
            "processes_growth": samples["processes"][-1] - samples["processes"][0],
            "rss_growth_mib": round(samples["rss_mib"][-1] - samples["rss_mib"][0], 1),
            **({"tracemalloc_growth": grown_lines(snapshots)} if len(snapshots) > 1 else {})}


def grown_lines(snapshots: list[tracemalloc.Snapshot], top: int = 8) -> list[str]:
    """Where live memory grew most from the end of round 2 to the end of the last round."""
    stats = snapshots[-1].compare_to(snapshots[0], "traceback")
    return [f"{s.size_diff / 1024:+.0f} KiB {s.count_diff:+d} blocks: "  # allocating line first, then its callers
            + " <- ".join(f"{'/'.join(Path(f.filename).parts[-2:])}:{f.lineno}" for f in list(s.traceback)[::-1][:4])
            for s in stats[:top]]


def assistant_turn(rng: random.Random, args, turn: int) -> str:
    if turn == args.turns - 1:
        return "All done: <answer>42</answer>"
    if rng.random() < args.adversarial:
        return rng.choice(ADVERSARIAL)
    calls = []
    for _ in range(rng.choice([1, 1, 2, 3])):
        server = rng.randrange(4)
        kinds = KINDS["stdio" if server < 2 else "http"]
        kind = rng.choices(list(kinds), weights=list(kinds.values()))[0]
        calls.append('<tool_call>\n{"name": "s%d__work", "arguments": {"kind": "%s", "ms": %d}}\n</tool_call>'
                     % (server, kind, rng.randrange(0, 30)))
    return "\n".join(calls)


def flaky_reward(completion: str, sample: dict) -> float:
    i = int(sample["messages"][0]["content"].split()[1])
    if i % 37 == 0:
        exit(3)
    if i % 41 == 0:
        raise ValueError("the grader broke")
    if i % 43 == 0:
        return "0.9"  # not a number: counted as an error
    return float("42" in completion)


def complete(traj, turns: int) -> bool:
    """The trajectory came back whole: its turns, a reward, and a result for every call of every turn but
    the last (whose calls run only if a turn is left to read them)."""
    if not traj.turns or traj.reward is None or len(traj.turns) > turns:
        return False
    *middle, last = traj.turns
    return (all(len(t.tool_results) == len(t.tool_calls) for t in middle)
            and len(last.tool_results) in (0, len(last.tool_calls)))


def open_fds() -> collections.Counter[str]:
    """This process's open fds by kind: socket, pipe, anon_inode, or the file's path."""
    kinds: collections.Counter[str] = collections.Counter()
    for fd in os.listdir("/proc/self/fd"):
        try:
            kinds[os.readlink(f"/proc/self/fd/{fd}").split(":")[0]] += 1
        except OSError:
            continue  # the fd listing itself, closed meanwhile
    return kinds


def descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = collections.defaultdict(list)
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit():
                children[int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])].append(int(entry.name))
        except (OSError, ValueError, IndexError):
            continue
    found, todo = [], list(children[pid])
    while todo:
        child = todo.pop()
        found.append(child)
        todo.extend(children[child])
    return found


def rss_mib() -> float:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS")) / 1024


async def load_tokenizer(path: str | None):
    """The tokenizer of `path`, else the embedded model's (the model is built and cached on first use)."""
    from transformers import AutoTokenizer

    from rl_factory.policy import resolve_model_path

    if path is None:
        async with ToolEnv.from_manifest(CALCULATOR_MANIFEST) as calculator:
            tools = await calculator.list_tools()
        path = resolve_model_path("builtin:tiny-calculator", tools, seed=0,
                                  log=lambda *a: print(*a, file=sys.stderr))
    return AutoTokenizer.from_pretrained(path)


if __name__ == "__main__":
    main()
