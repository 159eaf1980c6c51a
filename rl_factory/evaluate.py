"""Validation and `main_eval.sh`: roll out a dataset with the same tools and reward, and summarize.

The summary metrics (`accuracy`, `reward/mean`, `num_turns/mean`, `tool/call_rate`,
`tool/success_rate`, ...) are computed by `summarize`, which training uses for its per-step
metrics too, so a number means the same thing in metrics.jsonl and in eval results.
"""
from __future__ import annotations

import statistics
from collections import Counter
from pathlib import Path
from typing import Any

from rl_factory import jsonl
from rl_factory.base.files import write_atomic
from rl_factory.engines.base import SamplingParams
from rl_factory.rollout import Agent
from rl_factory.base.types import EPISODE_FAILED, Trajectory
from rewards.scorer import Scorer, reward_info_metrics


def summarize(trajs: list[Trajectory], success_threshold: float = 1.0) -> dict[str, float]:
    """Outcome, tool-use and length statistics of a list of scored trajectories."""
    return summarize_records([trajectory_record(t) for t in trajs], success_threshold)


def summarize_records(records: list[dict[str, Any]], success_threshold: float = 1.0) -> dict[str, float]:
    """`summarize` from rollouts-file lines (`trajectory_record`): what the verl backend has."""
    if not records:
        return {}
    rewards = [r["reward"] or 0.0 for r in records]
    results = [res for r in records for res in r["tool_results"]]
    metrics: dict[str, float] = {
        "reward/mean": statistics.fmean(rewards),
        "reward/std": statistics.pstdev(rewards),
        "accuracy": sum(r >= success_threshold for r in rewards) / len(records),
        "num_turns/mean": statistics.fmean(r["num_turns"] for r in records),
        "response_tokens/mean": statistics.fmean(r["generated_tokens"] for r in records),
        "sequence_tokens/mean": statistics.fmean(r["total_tokens"] for r in records),
        "tool/call_rate": sum(bool(r["tool_calls"]) for r in records) / len(records),
        "tool/calls_per_trajectory": len(results) / len(records),
        "tool/success_rate": (sum(res["error_kind"] is None for res in results) / len(results))
        if results else float("nan"),
    }
    for reason, count in Counter(r["stop_reason"] for r in records).items():
        metrics[f"stop/{reason}"] = count / len(records)
    for kind, count in Counter(res["error_kind"] for res in results if res["error_kind"] is not None).items():
        metrics[f"tool/error_rate/{kind}"] = count / len(results)  # share of calls (counts: tool/errors/*)
    metrics.update(reward_info_metrics([r.get("reward_info") for r in records]))  # e.g. reward/acc/mean
    return metrics


async def evaluate(agent: Agent, reward_fn, rows: list[dict], params: SamplingParams,
                   success_threshold: float = 1.0, n: int = 1,
                   on_done=None) -> tuple[dict[str, float], list[Trajectory]]:
    """Roll out every row `n` times with `params`, score, and summarize (`on_done(traj)`: progress)."""
    scorer = Scorer.wrap(reward_fn)  # scores each trajectory in its episode: rewards may verify by tool
    groups = await agent.rollout_groups(rows, list(range(len(rows))), n, params, on_done=on_done, scorer=scorer)
    trajs = [t for g in groups for t in g.trajectories]
    reward_stats = await scorer.wait(trajs)
    failed = sum(t.dropped_by == EPISODE_FAILED for t in trajs)
    if failed:
        reward_stats["episode/dropped"] = float(failed)
    return {**summarize(trajs, success_threshold), **reward_stats}, trajs


def trajectory_record(traj: Trajectory, tokenizer=None) -> dict[str, Any]:
    """One line of a rollouts file: what a person needs to read and debug a trajectory."""
    return {
        "sample_index": traj.sample_index,
        "id": traj.sample.get("id"),
        "data_source": traj.sample.get("data_source"),
        "messages": traj.messages,
        "answer": traj.sample.get("answer"),
        "reward": traj.reward,
        "reward_info": traj.reward_info,
        "advantage": traj.advantage,  # gae: the mean of its token advantages
        "dropped_by": traj.dropped_by,  # the rollout filter that kept it from training, or episode_error
        "process_rewards": traj.process_rewards,
        "stop_reason": traj.stop_reason,
        "num_turns": len(traj.turns),
        "turn_texts": [t.text for t in traj.turns],  # as decoded, call markup included (for re-scoring)
        "tool_calls": [{"name": c.name, "arguments": c.arguments, "error": c.error} for c in traj.tool_calls],
        "tool_results": [{"name": r.call.name, "text": r.text, "error_kind": r.error_kind,
                          "latency_s": round(r.latency_s, 4)} for r in traj.tool_results],
        **({"state": traj.state} if traj.state else {}),  # what the environment kept (env.environment)
        # async training: [[policy version, generated tokens], ...] in order (rl_factory/asynchrony.py)
        **({"policy_versions": [list(s) for s in traj.version_spans]} if traj.version_spans else {}),
        **({"episode_error": traj.reward_info.get("episode_error")} if traj.dropped_by == EPISODE_FAILED else {}),
        "prompt_tokens": len(traj.prompt_ids),
        "generated_tokens": traj.num_generated_tokens,
        "total_tokens": len(traj.token_ids),
    }


def write_rollouts(path: Path, trajs: list[Trajectory]) -> None:
    """Write atomically: a resumed run rewrites a step's file whole, never appends to it.

    Each line is scrubbed of every secret this process knows (`rl_factory.base.secrets.redact_known`), and text
    that is not valid Unicode (a lone surrogate) is written escaped rather than failing the step.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, "".join(jsonl.dumps(trajectory_record(traj)) for traj in trajs), errors=jsonl.WRITE_ERRORS)
