"""A verl job's steps as gpu_step.py and the scripts built on it read them: its metrics.jsonl lines (medians of the
steady steps, each step's numbers) and its stamped console log (when each step's line was printed)."""
from __future__ import annotations

import re
import statistics
from pathlib import Path


# the rollout phase's agent loops (rl_factory/backends/verl/run_dir.py, trajectory_timing): the slowest one, how long
# after the first the last began, and from the first start to the last return
TRAJECTORIES = {"slowest_trajectory": "timing/slowest_trajectory_s", "trajectory_starts": "timing/trajectory_starts_s",
                "trajectories_span": "timing/trajectories_span_s", "request_starts": "timing/request_starts_s",
                "before_first_request": "timing/before_first_request_s",
                "trajectory_starts_in_worker": "timing/trajectory_starts_in_worker_s"}


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def measured(lines: list[dict], until: int) -> list[dict]:
    """Steps 2..until (step 1 compiles and captures graphs; steps after `until` ran under a profiler)."""
    return [m for m in lines if 2 <= m["step"] <= until] or lines


def step_numbers(lines: list[dict], until: int) -> dict:
    """Median per-phase seconds and token counts over steps 2..until."""
    steady = measured(lines, until)
    phases = {"generate": "timing/rollout_s", "old_log_prob": "timing/old_log_prob_s", "update": "timing/update_s",
              "update_weights": "timing/update_weights_s", "reward": "timing/reward_s", "step": "timing/step_s",
              **TRAJECTORIES}
    out = {name: _median([m[key] for m in steady if key in m]) for name, key in phases.items()}
    out["total_tokens"] = _median([m["perf/total_num_tokens"] for m in steady if "perf/total_num_tokens" in m])
    # each measured step's numbers, for a record over two launches (benchmarks/launches.py)
    out["per_step"] = {name: [m[key] for m in steady if key in m] for name, key in
                       {**phases, "total_tokens": "perf/total_num_tokens"}.items() if name not in TRAJECTORIES}
    out["all_step_s"] = [round(m.get("timing/step_s", float("nan")), 3) for m in lines]
    # verl's V1 trainer logs the actor's peak memory as actor/perf/*, the legacy trainer as perf/*
    for name in ("max_memory_allocated_gb", "max_memory_reserved_gb"):
        out[name] = max((m.get(f"actor/perf/{name}", m.get(f"perf/{name}", 0)) for m in lines), default=0)
    return out


def step_ends(log: Path, launched: float) -> dict[int, float]:
    """step -> unix time its metrics line was printed (verl's console logger: `step:N - ...`, stamped)."""
    ends = {}
    for line in log.read_text(errors="replace").splitlines() if log.exists() else []:
        found = re.match(r"\+\s*([0-9.]+)s .*?\bstep:(\d+) - ", line)
        if found:
            ends[int(found.group(2))] = round(launched + float(found.group(1)), 1)
    return ends
