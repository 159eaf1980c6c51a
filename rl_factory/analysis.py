"""What went wrong, in numbers: pass@k, breakdowns, a failure taxonomy and bootstrap comparisons.

Everything works on rollout records (the lines of `rollouts.jsonl`, `rl_factory.evaluate.trajectory_record`),
so `main_eval.sh`, `python -m rl_factory.rescore` and the report compute the same numbers from the
same files.

- `pass_at_k`: the unbiased estimator of Chen et al. (2021), 1 - C(n-c, k) / C(n, k) per row, averaged
  over rows, for k = 1, 2, 4, ... up to the samples per row (and n itself).
- `failure_taxonomy`: every trajectory that did not succeed gets exactly one cause, the first that
  applies of: episode failed (its episode did not open, or its environment raised: nothing ran),
  truncated (the token budget cut it), malformed call (a call the parser could not read),
  tool error (a call failed: unknown tool, bad arguments, timeout, server error, crash), no tool call
  (the task has tools and none was called), then by how it stopped (`stop_reason`): not solved in
  max_turns (the turns ran out: the model still calling tools, or an environment still answering),
  ended by the environment (it ended the episode, `env_done`, and the episode scored low), wrong answer
  (the model answered and the answer scored low).
- `bootstrap_diff`: the difference of a per-row mean between two evaluations with a percentile
  bootstrap CI; rows are paired by `id` (else by row index) when both evaluated the same rows.
"""
from __future__ import annotations

import math
import random
import statistics
from collections import Counter, defaultdict
from typing import Any

FAILURE_KINDS = ("episode failed", "truncated", "malformed call", "tool error", "no tool call",
                 "not solved in max_turns", "ended by the environment", "wrong answer")
# How a trajectory that ran cleanly and scored low stopped, by its stop_reason (rl_factory/rollout.py).
LOW_SCORE_BY_STOP = {"max_turns": "not solved in max_turns", "env_done": "ended by the environment"}
EXAMPLES_PER_KIND = 5


def is_correct(record: dict, threshold: float) -> bool:
    reward = record.get("reward")
    return isinstance(reward, (int, float)) and reward >= threshold


def row_key(record: dict) -> str:
    """A row's id column if it has one, else its index in the evaluated file."""
    return str(record["id"]) if record.get("id") is not None else f"row {record.get('sample_index')}"


def by_row(records: list[dict]) -> dict[str, list[dict]]:
    rows: dict[str, list[dict]] = defaultdict(list)
    for r in records:
        rows[row_key(r)].append(r)
    return dict(rows)


def pass_at_k(records: list[dict], threshold: float) -> dict[str, float]:
    """{"1": p, "2": p, ...}: k up to the smallest number of samples any row has."""
    rows = by_row(records)
    if not rows:
        return {}
    n_min = min(len(v) for v in rows.values())
    ks = sorted({k for k in (2 ** i for i in range(int(math.log2(n_min)) + 1))} | {n_min})
    out = {}
    for k in ks:
        values = []
        for samples in rows.values():
            n, c = len(samples), sum(is_correct(s, threshold) for s in samples)
            values.append(1.0 - (math.comb(n - c, k) / math.comb(n, k) if n - c >= k else 0.0))
        out[str(k)] = statistics.fmean(values)
    return out


def failure_kind(record: dict, has_tools: bool) -> str:
    if record.get("stop_reason") == "episode_error":
        return "episode failed"
    if record.get("stop_reason") == "max_tokens":
        return "truncated"
    calls, results = record.get("tool_calls") or [], record.get("tool_results") or []
    if any(c.get("error") for c in calls) or any(r.get("error_kind") == "parse" for r in results):
        return "malformed call"
    if any(r.get("error_kind") for r in results):
        return "tool error"
    if has_tools and not calls:
        return "no tool call"
    return LOW_SCORE_BY_STOP.get(record.get("stop_reason"), "wrong answer")


def failure_taxonomy(records: list[dict], threshold: float, has_tools: bool) -> dict[str, dict[str, Any]]:
    """{kind: {"count", "share" (of all trajectories), "examples" (row ids)}} for the kinds that occur."""
    out: dict[str, dict[str, Any]] = {}
    for r in records:
        if is_correct(r, threshold):
            continue
        kind = failure_kind(r, has_tools)
        entry = out.setdefault(kind, {"count": 0, "share": 0.0, "examples": []})
        entry["count"] += 1
        if len(entry["examples"]) < EXAMPLES_PER_KIND and row_key(r) not in entry["examples"]:
            entry["examples"].append(row_key(r))
    for entry in out.values():
        entry["share"] = entry["count"] / len(records)
    return {k: out[k] for k in FAILURE_KINDS if k in out}


def group_summary(records: list[dict], threshold: float) -> dict[str, float]:
    calls = [c for r in records for c in (r.get("tool_results") or [])]
    return {
        "rows": float(len(by_row(records))), "trajectories": float(len(records)),
        "accuracy": statistics.fmean(is_correct(r, threshold) for r in records),
        "reward/mean": statistics.fmean(float(r.get("reward") or 0.0) for r in records),
        "tool/call_rate": statistics.fmean(bool(r.get("tool_calls")) for r in records),
        "tool/success_rate": (sum(not c.get("error_kind") for c in calls) / len(calls)) if calls else float("nan"),
    }


def by_data_source(records: list[dict], threshold: float) -> dict[str, dict[str, float]]:
    groups: dict[str, list[dict]] = defaultdict(list)
    for r in records:
        groups[str(r.get("data_source") or "(none)")].append(r)
    return {name: group_summary(rs, threshold) for name, rs in sorted(groups.items())}


def by_tool(records: list[dict], threshold: float) -> dict[str, dict[str, Any]]:
    """Per tool: calls, success rate, failures by kind, and the accuracy of trajectories that used it."""
    out: dict[str, dict[str, Any]] = {}
    users: dict[str, list[dict]] = defaultdict(list)
    for r in records:
        for name in {c.get("name") or "(unnamed)" for c in (r.get("tool_calls") or [])}:
            users[name].append(r)
        for res in r.get("tool_results") or []:
            entry = out.setdefault(res.get("name") or "(unnamed)", {"calls": 0, "errors": Counter()})
            entry["calls"] += 1
            if res.get("error_kind"):
                entry["errors"][res["error_kind"]] += 1
    for name, entry in out.items():
        entry["success_rate"] = 1.0 - sum(entry["errors"].values()) / entry["calls"]
        entry["errors"] = dict(entry["errors"])
        used = users.get(name, [])
        entry["accuracy_when_used"] = statistics.fmean(is_correct(r, threshold) for r in used) if used else None
    return dict(sorted(out.items()))


def per_row(records: list[dict], threshold: float) -> list[dict[str, Any]]:
    """One entry per row: its id, data_source, mean correctness and mean reward over its samples."""
    return [{"id": key, "data_source": rs[0].get("data_source"),
             "correct": statistics.fmean(is_correct(r, threshold) for r in rs),
             "reward": statistics.fmean(float(r.get("reward") or 0.0) for r in rs)}
            for key, rs in by_row(records).items()]


def bootstrap_diff(this: list[float], other: list[float], paired: bool, resamples: int = 2000,
                   seed: int = 0, level: float = 0.95) -> dict[str, float]:
    """mean(this) - mean(other) and its percentile bootstrap CI (paired: resample rows jointly)."""
    rng = random.Random(seed)
    diffs = []
    for _ in range(resamples):
        if paired:
            idx = [rng.randrange(len(this)) for _ in this]
            diffs.append(statistics.fmean(this[i] - other[i] for i in idx))
        else:
            a = [this[rng.randrange(len(this))] for _ in this]
            b = [other[rng.randrange(len(other))] for _ in other]
            diffs.append(statistics.fmean(a) - statistics.fmean(b))
    diffs.sort()
    lo = diffs[int((1 - level) / 2 * resamples)]
    hi = diffs[min(resamples - 1, int((1 + level) / 2 * resamples))]
    return {"this": statistics.fmean(this), "other": statistics.fmean(other),
            "difference": statistics.fmean(this) - statistics.fmean(other), "ci_low": lo, "ci_high": hi,
            "significant": not (lo <= 0.0 <= hi)}


def compare(this_rows: list[dict], other_rows: list[dict], resamples: int = 2000, seed: int = 0) -> dict[str, Any]:
    """Compare two evaluations' per-row results (`per_row` of each) on accuracy and mean reward."""
    other_by_id = {r["id"]: r for r in other_rows}
    shared = [r["id"] for r in this_rows if r["id"] in other_by_id]
    paired = len(shared) == len(this_rows) == len(other_rows)
    metrics = {}
    for metric, field in (("accuracy", "correct"), ("reward/mean", "reward")):
        if paired:
            a = [r[field] for r in this_rows]
            b = [other_by_id[r["id"]][field] for r in this_rows]
        else:
            a, b = [r[field] for r in this_rows], [r[field] for r in other_rows]
        metrics[metric] = bootstrap_diff(a, b, paired, resamples, seed)
    return {"paired": paired, "rows": [len(this_rows), len(other_rows)], "resamples": resamples, "metrics": metrics}
