"""The line of `examples/arena_vs_pointwise/verl_vllm_judge.sh` (the arena arm on verl, its judge a vLLM server
on the same GPU), from the run's directory: the script calls `summarize` after the run and records the line
with benchmarks/record.py in benchmarks/results/arena_vllm_judge.jsonl.

    .venv/bin/python examples/arena_vs_pointwise/summary.py RUN_DIR [JUDGE_MODEL] [SERVED]   # the line, from a run's files

Per step: the tournaments' judge calls, requests, failures and ties (the step's `arena/*` metrics, which the
verl backend sums over the groups' lines, rl_factory/backends/verl/run_dir.py), the step's seconds and the run
guard's findings, vLLM's weight-sync receipts among them; validation accuracy; the guard's bundles; and how many
requests the judge's server answered (`vllm:request_success_total`, read by the script while it still runs).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from rl_factory.jsonl import read_records

KEYS = ("arena/judge_calls", "arena/judge_requests", "arena/judge_failures", "arena/ties", "timing/step_s",
        "guard/violations", "guard/tokens/mismatched", "guard/receipts/stale", "guard/receipts/weights_mismatch",
        "guard/receipts/engine_syncs", "guard/receipts/engine_unlanded", "guard/receipts/engine_sync_s")


def summarize(run: Path, judge: str | None = None, served: float | None = None) -> dict[str, Any]:
    lines = [m for m in read_records(Path(run) / "metrics.jsonl", torn_ok=True) if isinstance(m, dict)]
    steps = [m for m in lines if "arena/judge_calls" in m]
    calls = sum(m["arena/judge_calls"] for m in steps)
    ties = sum(m.get("arena/ties", 0.0) for m in steps)
    return {"judge_model": judge, "steps": len(steps),
            "per_step": {k: [m.get(k) for m in steps] for k in KEYS},
            "judge_calls": calls, "tie_share": round(ties / calls, 4) if calls else None,
            "judge_served_requests": served,
            "val_accuracy": {m["step"]: m["val/accuracy"] for m in lines if "val/accuracy" in m},
            "guard_violations": sum(m.get("guard/violations", 0.0) for m in lines),
            "guard_bundles": sorted(p.name for p in (Path(run) / "guard").glob("*") if p.is_dir()),
            "launch_to_first_step_s": _startup(Path(run))}


def _startup(run: Path) -> float | None:
    try:
        return json.loads((run / "startup.json").read_text()).get("launch_to_first_step_s")
    except (OSError, ValueError):
        return None


if __name__ == "__main__":
    args = sys.argv[1:]
    if not args:
        raise SystemExit(__doc__)
    print(json.dumps(summarize(Path(args[0]), args[1] if len(args) > 1 else None,
                               float(args[2]) if len(args) > 2 else None)))
