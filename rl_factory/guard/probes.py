"""Reward probes: another sample's trajectory scored against this sample's answer (`reward_probe` check).

A pair (A, B) is two trajectories of different samples whose completions differ and whose rewards differ,
A's the higher. The probe is B's trajectory (completion, tool calls, results, messages) with A's dataset
row: a reward that reads the completion scores it like B, or anything but A; one that never reads the
completion scores it exactly like A. The probe is scored by the run's own `Scorer` (same executor, timeout,
on_error), outside any episode: a reward that calls tools reaches the run-wide servers.
"""
from __future__ import annotations

import dataclasses
from typing import Any

from rl_factory.base.types import Trajectory


def pick_pairs(trajs: list[Trajectory], limit: int, offset: int = 0) -> list[tuple[int, int]]:
    """Up to `limit` (A, B) positions: A a best-rewarded trajectory, B of another sample, a lower reward and
    another completion. `offset` rotates through the candidates so that steps probe different pairs."""
    scored = [i for i, t in enumerate(trajs) if t.reward is not None]
    if not scored:
        return []
    order = sorted(scored, key=lambda i: (-trajs[i].reward, i))
    pairs: list[tuple[int, int]] = []
    for k in range(len(order)):
        a = order[(k + offset) % len(order)]
        b = next((j for j in reversed(order) if trajs[j].sample_index != trajs[a].sample_index
                  and trajs[j].reward < trajs[a].reward and trajs[j].completion != trajs[a].completion), None)
        if b is not None:
            pairs.append((a, b))
        if len(pairs) >= limit:
            break
    return pairs


async def run_probes(scorer: Any, trajs: list[Trajectory], limit: int, offset: int = 0) -> list[dict[str, Any]]:
    """Score the probes of up to `limit` pairs; one JSON record per probe."""
    out = []
    for a, b in pick_pairs(trajs, limit, offset):
        probe = dataclasses.replace(trajs[b], sample=trajs[a].sample, reward=None, reward_info={},
                                    process_rewards=[], advantage=None)
        try:
            value = await scorer.score(probe)
        except Exception:  # noqa: BLE001 - a reward that refuses a foreign completion tells nothing either way
            continue
        out.append({"position": a, "other_position": b, "sample_index": trajs[a].sample_index,
                    "other_index": trajs[b].sample_index, "reward": float(trajs[a].reward), "probe": float(value)})
    return out
