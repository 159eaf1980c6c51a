"""vLLM's per-iteration log lines, summed up: how many engine steps a rollout took and of what kind.

    python benchmarks/iterations.py outputs/gpu_suite/run-*/bench_stdout.log outputs/gpu_suite/run-*/ceiling-vllm_configured.log

vLLM logs one line per engine step where its engine arguments ask for it
(`+actor_rollout_ref.rollout.engine_kwargs.vllm.enable_logging_iteration_details=true`; the `vllm_configured`
ceiling takes the rollout's engine arguments, so it logs the same lines into `ceiling-vllm_configured.log`):

    Iteration(412): 3 context requests, 96 context tokens, 125 generation requests, 125 generation tokens, iteration elapsed time: 0.41 ms

A step with context (prompt) tokens and generation tokens together is mixed: under `FULL_DECODE_ONLY` it runs
without CUDA graphs, under `FULL` (the tuning's, rl_factory/backends/verl/vllm_graphs.py) as one graph up to the
largest capture size. The elapsed time is only how long the engine waited for that step's result (with async
scheduling the next step is scheduled while this one runs): near zero where the engine's own Python, not the GPU,
sets the pace.
One JSON line per log: the steps by kind (decode-only, prefill-only, mixed), each kind's median and total wait, the
largest batch, and for a job's log the steps per rollout where the number of rollouts is given (`--rollouts`).
"""
from __future__ import annotations

import argparse
import re
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.record import emit  # noqa: E402

LINE = re.compile(r"Iteration\((\d+)\): (\d+) context requests, (\d+) context tokens, (\d+) generation requests, "
                  r"(\d+) generation tokens, iteration elapsed time: ([\d.]+) ms")


def parse(text: str) -> list[dict]:
    return [{"index": int(m[1]), "ctx_reqs": int(m[2]), "ctx_tokens": int(m[3]), "gen_reqs": int(m[4]),
             "gen_tokens": int(m[5]), "wait_ms": float(m[6])} for m in LINE.finditer(text)]


def kind(step: dict) -> str:
    if step["ctx_tokens"] and step["gen_tokens"]:
        return "mixed"
    return "prefill" if step["ctx_tokens"] else "decode"


def summary(steps: list[dict], rollouts: int | None = None) -> dict:
    out: dict = {"steps": len(steps)}
    for name in ("decode", "prefill", "mixed"):
        waits = [s["wait_ms"] for s in steps if kind(s) == name]
        out[name] = {"steps": len(waits), "median_wait_ms": statistics.median(waits) if waits else None,
                     "total_wait_s": round(sum(waits) / 1000, 4)}
    out["max_batch"] = max((s["ctx_reqs"] + s["gen_reqs"] for s in steps), default=0)
    out["context_tokens"] = sum(s["ctx_tokens"] for s in steps)
    if rollouts:
        out["steps_per_rollout"] = len(steps) / rollouts
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("logs", nargs="+", type=Path)
    ap.add_argument("--rollouts", type=int, default=None, help="rollouts in each log (a job's steps), for steps_per_rollout")
    args = ap.parse_args()
    for log in args.logs:
        steps = parse(log.read_text(errors="replace"))
        emit("iterations", {"bench": "iterations", "log": str(log), **summary(steps, args.rollouts)})


if __name__ == "__main__":
    main()
