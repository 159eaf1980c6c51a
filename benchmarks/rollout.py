"""Rollout wall time: a lockstep loop vs. ours vs. the critical-path ideal, in one process.

The same trajectories run three ways, with the same engine, the same real MCP tool server
(benchmarks/servers/latency_server.py, whose `wait(seconds)` tool sleeps as long as it is told)
and the same seeded tool latencies (lognormal, mean `--tool-latency-ms`, log-sd `--sigma`, one
draw per trajectory and turn):

  * lockstep -- the peers' design: all active trajectories generate, then all run their tools,
                then the next turn starts. Implemented as a barrier in front of every generate
                and call_batch of `Agent.rollout`, so it runs exactly our code plus the barrier.
  * async    -- ours: every trajectory is its own `Agent.rollout` task, all gathered.
  * ideal    -- the critical path: for each trajectory, the sum of its own generation and tool
                times; the maximum over trajectories. Tool times are the drawn latencies.
                Generation times are the scripted ones (`--engine scripted`), or, with
                `--engine hf`, each call's fastest time over all runs of both modes (a real
                engine has no programmed time; a call is slowed by the batch it shares).

What the "model" says is scripted in both engines, so every trajectory makes `--turns - 1` tool
calls and then answers: each call asks the tool to wait for that trajectory's drawn latency.
With `--engine scripted` a turn takes `--gen-ms` + `--gen-ms-per-token` per token; with
`--engine hf` every turn first runs a real, greedy decode of the same prompt on the embedded HF
engine (shared by all trajectories, so it batches them), whose output is then replaced by the
scripted turn.

Prints one JSON line (medians over `--repeats`; `runs` keeps every wall time). Besides the three
times: `lockstep_model_s` is lockstep with no overhead (per turn, the slowest generation plus the
slowest tool), `*_tool_overhead_ms_*` the measured minus the drawn tool latency per call, and
`async_gap_*` splits `async_s - ideal_s` for the ideal's critical trajectory into time lost inside
its own calls, outside them (decoding, parsing, templating, waiting for the event loop) and after
it finished.

    .venv/bin/python benchmarks/rollout.py --trajectories 64 --turns 4 --tool-latency-ms 200 --sigma 1.0
    .venv/bin/python benchmarks/rollout.py --engine hf --trajectories 64 --turns 4
"""
from __future__ import annotations

import argparse
import asyncio
import datetime
import math
import os
import platform
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from benchmarks.record import emit  # noqa: E402
os.environ.setdefault("OMP_NUM_THREADS", "1")  # a tiny model on a shared CPU: one thread is fastest

from envs import ToolEnv, get_parser  # noqa: E402
from rl_factory.chat import ChatFormat  # noqa: E402
from rl_factory.engines.base import Generation, SamplingParams  # noqa: E402
from rl_factory.engines.scripted import ScriptedEngine  # noqa: E402
from rl_factory.rollout import Agent, RolloutConfig  # noqa: E402
from rl_factory.types import ToolCall, ToolResult  # noqa: E402

SERVER = Path(__file__).resolve().parent / "servers" / "latency_server.py"
CALCULATOR_MANIFEST = ROOT / "configs" / "tools" / "calculator.yaml"
TOOL_CALL = '<tool_call>\n{{"name": "wait", "arguments": {{"seconds": {seconds:.6f}}}}}\n</tool_call>'
ANSWER = "All waits are done."


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trajectories", type=int, default=64)
    parser.add_argument("--turns", type=int, default=4, help="assistant turns; all but the last call the tool")
    parser.add_argument("--tool-latency-ms", type=float, default=200.0, help="mean tool latency")
    parser.add_argument("--sigma", type=float, default=1.0, help="log-sd of the lognormal tool latency")
    parser.add_argument("--engine", choices=["scripted", "hf"], default="scripted")
    parser.add_argument("--gen-ms", type=float, default=10.0, help="scripted: time per turn")
    parser.add_argument("--gen-ms-per-token", type=float, default=0.5, help="scripted: time per token")
    parser.add_argument("--model-path", default=None, help="hf: a model dir (default: the embedded tiny model)")
    parser.add_argument("--device", default="cpu", help="hf: cpu, cuda, ...")
    parser.add_argument("--max-new-tokens", type=int, default=48, help="hf: tokens per turn at most")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each mode; medians are printed")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    emit("rollout", asyncio.run(run(args)))


def draw_latencies(args: argparse.Namespace) -> list[list[float]]:
    """Seconds per trajectory and tool turn: lognormal with mean tool_latency_ms."""
    rng = random.Random(args.seed)
    mean_s = args.tool_latency_ms / 1e3
    mu = math.log(mean_s) - args.sigma ** 2 / 2
    return [[rng.lognormvariate(mu, args.sigma) for _ in range(args.turns - 1)]
            for _ in range(args.trajectories)]


async def run(args: argparse.Namespace) -> dict[str, Any]:
    load_before = os.getloadavg()[0]
    latencies = draw_latencies(args)
    tokenizer, hf = await load_model(args)
    entry = {"command": "python", "args": [str(SERVER)], "timeout_s": 600,
             "max_concurrency": max(64, args.trajectories)}
    async with ToolEnv.from_manifest({"mcpServers": {"latency": entry}}) as env:
        fmt = ChatFormat(tokenizer, await env.list_tools())
        bench = Bench(args, latencies, fmt, env, hf)
        await bench.warm_up()
        runs: dict[str, list[dict]] = {"lockstep": [], "async": []}
        try:
            for _ in range(args.repeats):
                for mode in runs:
                    runs[mode].append(await bench.run_mode(mode))
        finally:
            if hf is not None:
                await hf.close()
    return summarize(args, bench, runs, load_before)


class Barrier:
    """A reusable barrier whose party count shrinks as trajectories finish (lockstep mode).

    Every trajectory alternates generate and call_batch, and all are released together, so all
    waiting trajectories are always in the same phase of the same turn.
    """

    def __init__(self, parties: int):
        self.parties, self.waiting = parties, 0
        self.released = asyncio.Event()

    async def wait(self) -> None:
        self.waiting += 1
        released = self.released
        if self.waiting >= self.parties:
            self._release()
        else:
            await released.wait()

    def leave(self) -> None:
        self.parties -= 1
        if self.waiting and self.waiting >= self.parties:
            self._release()

    def _release(self) -> None:
        self.released.set()
        self.released, self.waiting = asyncio.Event(), 0


class Lane:
    """One trajectory's engine and tools as its Agent sees them: times every call and, in
    lockstep mode, holds each call at the batch-wide barrier first."""

    def __init__(self, engine: ScriptedEngine, env: ToolEnv, barrier: Barrier | None, pace: Any = None,
                 pace_tokens: int = 0):
        self.engine, self.env, self.barrier = engine, env, barrier
        self.pace, self.pace_tokens = pace, pace_tokens
        self.gen_s: list[float] = []
        self.tool_s: list[float] = []
        self.tool_results: list[ToolResult] = []

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> Generation:
        if self.barrier:
            await self.barrier.wait()
        start = time.perf_counter()
        if self.pace is not None:  # a real decode of this prompt sets the pace; its text is not used
            await self.pace.generate(prompt_ids, SamplingParams(params.temperature, params.top_p,
                                                                min(self.pace_tokens, params.max_new_tokens)))
        gen = await self.engine.generate(prompt_ids, params)
        self.gen_s.append(time.perf_counter() - start)
        return gen

    async def call_batch(self, calls: list[ToolCall]) -> list[ToolResult]:
        if self.barrier:
            await self.barrier.wait()
        start = time.perf_counter()
        results = await self.env.call_batch(calls)
        self.tool_s.append(time.perf_counter() - start)
        self.tool_results += results
        return results


class Bench:
    """The trajectories, their scripts and drawn latencies, and how to run them in one mode."""

    def __init__(self, args: argparse.Namespace, latencies: list[list[float]], fmt: ChatFormat,
                 env: ToolEnv, hf: Any):
        self.args, self.latencies, self.fmt, self.env, self.hf = args, latencies, fmt, env, hf
        self.parser = get_parser("hermes")
        self.cfg = RolloutConfig(max_turns=args.turns, max_response_tokens=256,
                                 max_total_tokens=1 << 20, max_tool_response_tokens=64)
        self.params = SamplingParams(temperature=0.0, top_p=1.0)  # greedy: the same decodes in every mode
        self.samples = [{"messages": [{"role": "user", "content": f"What is {101 + i} * {7 + i % 13}?"}]}
                        for i in range(args.trajectories)]
        self.scripted_gen_s: list[list[float]] | None = None  # as programmed; the same in every run

    def engine(self, i: int) -> ScriptedEngine:
        script = [TOOL_CALL.format(seconds=s) for s in self.latencies[i]] + [ANSWER]
        if self.hf is not None:
            return ScriptedEngine(self.fmt.tokenizer, script)
        return ScriptedEngine(self.fmt.tokenizer, script, delay_s=self.args.gen_ms / 1e3,
                              per_token_s=self.args.gen_ms_per_token / 1e3)

    async def warm_up(self) -> None:
        await self.env.call_batch([ToolCall("wait", {"seconds": 0.0})] * 8)
        if self.hf is not None:
            prompt = self.fmt.prompt_ids(self.samples[0]["messages"])
            await asyncio.gather(*(self.hf.generate(prompt, SamplingParams(0.0, 1.0, 8)) for _ in range(4)))

    async def run_mode(self, mode: str) -> dict[str, float]:
        n = self.args.trajectories
        barrier = Barrier(n) if mode == "lockstep" else None
        lanes = [Lane(self.engine(i), self.env, barrier, self.hf, self.args.max_new_tokens) for i in range(n)]
        finished = [0.0] * n  # when each trajectory's rollout returned

        async def rollout(i: int):
            agent = Agent(lanes[i], lanes[i], self.fmt, self.parser, self.cfg)
            try:
                return await agent.rollout(self.samples[i], i, self.params)
            finally:
                finished[i] = time.perf_counter()
                if barrier:
                    barrier.leave()

        start = time.perf_counter()
        trajectories = await asyncio.gather(*(rollout(i) for i in range(n)))
        wall = time.perf_counter() - start
        for traj, lane in zip(trajectories, lanes):
            if len(traj.turns) != self.args.turns or not all(r.ok for r in lane.tool_results):
                raise RuntimeError(f"trajectory {traj.sample_index} did not run as scripted: "
                                   f"{traj.stop_reason}, {[r.text for r in lane.tool_results]}")
        if self.hf is None and self.scripted_gen_s is None:
            self.scripted_gen_s = [lane.engine.busy_s for lane in lanes]
        overhead_ms = sorted((r.latency_s - drawn) * 1e3 for lane, row in zip(lanes, self.latencies)
                             for r, drawn in zip(lane.tool_results, row))
        return {
            "mode": mode,
            "wall_s": wall,
            "finished_s": [t - start for t in finished],
            "gen_s": [lane.gen_s for lane in lanes],
            "tool_s": [lane.tool_s for lane in lanes],
            "tool_overhead_ms_p50": overhead_ms[len(overhead_ms) // 2],
            "tool_overhead_ms_p99": overhead_ms[int(0.99 * (len(overhead_ms) - 1))],
        }

    def ideal_gen_s(self, runs: list[dict]) -> list[list[float]]:
        """Each trajectory's generation time per turn, for the ideal: the scripted times, or with
        the HF engine each call's fastest time over all runs of both modes."""
        if self.hf is None:
            return self.scripted_gen_s
        return [[min(r["gen_s"][i][k] for r in runs) for k in range(self.args.turns)]
                for i in range(self.args.trajectories)]


def gaps(run: dict, ideal: list[float]) -> dict[str, float]:
    """Where the trajectory on the ideal's critical path lost time against its ideal: inside its own
    calls (tool round trips, generation slower than in the ideal), outside them (decoding, parsing,
    tokenizing, waiting for the event loop), and after it finished (others still running)."""
    k = max(range(len(ideal)), key=ideal.__getitem__)
    in_calls = sum(run["gen_s"][k]) + sum(run["tool_s"][k])
    return {"gap_in_calls_s": in_calls - ideal[k],
            "gap_outside_calls_s": run["finished_s"][k] - in_calls,
            "gap_after_critical_s": run["wall_s"] - run["finished_s"][k]}


def summarize(args: argparse.Namespace, bench: Bench, runs: dict[str, list[dict]],
              load_before: float) -> dict[str, Any]:
    gen_s = bench.ideal_gen_s(runs["lockstep"] + runs["async"])
    totals = [sum(g) + sum(t) for g, t in zip(gen_s, bench.latencies)]
    ideal_s = max(totals)
    # Lockstep without any overhead: every turn waits for its slowest generation and its slowest tool.
    lockstep_model_s = sum(map(max, zip(*gen_s))) + sum(map(max, zip(*bench.latencies)))
    for run in runs["async"]:
        run.update(gaps(run, totals))
    for rs in runs.values():
        for run in rs:
            run["generation_s"] = statistics.mean(map(sum, run["gen_s"]))
            run["tool_s"] = statistics.mean(map(sum, run["tool_s"]))

    def median(mode: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[mode])

    lockstep_s, async_s = median("lockstep", "wall_s"), median("async", "wall_s")
    out: dict[str, Any] = {
        "benchmark": "rollout",
        "engine": args.engine,
        "trajectories": args.trajectories,
        "turns": args.turns,
        "tool_latency_ms": args.tool_latency_ms,
        "sigma": args.sigma,
        "lockstep_s": round(lockstep_s, 3),
        "async_s": round(async_s, 3),
        "ideal_s": round(ideal_s, 3),
        "speedup_vs_lockstep": round(lockstep_s / async_s, 3),
        "ratio_to_ideal": round(async_s / ideal_s, 3),
        "lockstep_to_ideal": round(lockstep_s / ideal_s, 3),
        "lockstep_model_s": round(lockstep_model_s, 3),
        "ideal_generation_s": round(statistics.mean(map(sum, gen_s)), 3),
        "ideal_tool_s": round(statistics.mean(map(sum, bench.latencies)), 3),
    }
    for key in ("generation_s", "tool_s", "tool_overhead_ms_p50", "tool_overhead_ms_p99"):
        for mode in runs:
            out[f"{mode}_{key}"] = round(median(mode, key), 3)
    for key in ("gap_in_calls_s", "gap_outside_calls_s", "gap_after_critical_s"):
        out[f"async_{key}"] = round(median("async", key), 3)
    if args.engine == "scripted":
        out.update(gen_ms=args.gen_ms, gen_ms_per_token=args.gen_ms_per_token)
    else:
        out.update(model=args.model_path or "builtin:tiny-calculator", device=args.device,
                   max_new_tokens=args.max_new_tokens)
    out.update({
        "repeats": args.repeats,
        "seed": args.seed,
        "runs": {mode: [round(r["wall_s"], 3) for r in rs] for mode, rs in runs.items()},
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "loadavg_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
    })
    return out


async def load_model(args: argparse.Namespace):
    """The tokenizer, and for `--engine hf` the HF engine on the model (default: the embedded one)."""
    from rl_factory.policy import ModelConfig, load_policy, resolve_model_path

    path = args.model_path
    if path is None:  # the embedded model is built (and cached) for the calculator's tool schemas
        async with ToolEnv.from_manifest(CALCULATOR_MANIFEST) as calculator:
            tools = await calculator.list_tools()
        path = resolve_model_path("builtin:tiny-calculator", tools, seed=0, log=lambda *a: print(*a, file=sys.stderr))
    if args.engine == "scripted":
        from transformers import AutoTokenizer
        return AutoTokenizer.from_pretrained(path), None
    from rl_factory.engines.hf import HFEngine

    policy = load_policy(ModelConfig(path=path, device=args.device), tools=[])
    policy.model.eval()
    engine = HFEngine(policy.model, eos_token_id=policy.tokenizer.eos_token_id,
                      pad_token_id=policy.tokenizer.pad_token_id, max_batch_size=args.trajectories,
                      autocast=policy.autocast)
    return policy.tokenizer, engine


if __name__ == "__main__":
    main()
