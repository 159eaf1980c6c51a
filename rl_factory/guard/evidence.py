"""What the guard keeps of each trajectory: digests, mask coverage, receipts, tool and sampling counts.

The engine side writes a receipt per generated turn (`Generation.receipt`, kept as `Turn.receipt`):
the digest of the ids it sampled, the policy version it sampled with and, where the engine can say, a
fingerprint of its weights. The trainer side is what the update will train: every run of loss-masked
ids of every training sample (`Trajectory.training_samples`). Both sides are reduced here to one JSON
record per trajectory, the same record on both backends (the verl agent loop builds it from the
same `Trajectory`), so every check and every replay reads only JSON. On verl the trainer's side is then
replaced by what the actor's batch holds (`run_digests` of its rows: rl_factory/backends/verl/trained.py).
"""
from __future__ import annotations

import hashlib
import math
from array import array
from typing import Any

from rl_factory.base.types import Trajectory


def digest(ids: list[int]) -> str:
    """A short hash of a token-id sequence (the receipt's and the trainer's, computed the same way)."""
    return hashlib.blake2b(array("q", ids).tobytes(), digest_size=8).hexdigest()


def mask_runs(ids: list[int], mask: list[int]) -> list[list[int]]:
    """The maximal runs of ids whose loss mask is 1: what an update trains, span by span."""
    runs, current = [], []
    for token, m in zip(ids, mask):
        if m:
            current.append(token)
        elif current:
            runs.append(current)
            current = []
    if current:
        runs.append(current)
    return runs


def run_digests(ids: Any, mask: Any) -> list[str]:
    """`digest` of every run of `mask_runs(ids, mask)`, for arrays (a row of verl's batch, rl_factory/backends/verl/
    trained.py): the same bytes are hashed, so the same tokens give the same digests, without a loop over tokens.
    A mask shorter than the ids leaves the rest untrained (verl's padding of a short mask is 0)."""
    import numpy as np

    ids = np.ascontiguousarray(np.asarray(ids, dtype=np.int64))
    mask = np.asarray(mask).reshape(-1)[: len(ids)] != 0
    mask = np.concatenate([mask, np.zeros(len(ids) - len(mask), dtype=bool)])
    edges = np.flatnonzero(np.diff(np.concatenate(([0], mask.astype(np.int8), [0]))))
    return [hashlib.blake2b(ids[start:end].tobytes(), digest_size=8).hexdigest()
            for start, end in zip(edges[::2].tolist(), edges[1::2].tolist())]


def receipt(ids: list[int], version: int | None, weights: str | None) -> dict[str, Any]:
    """An engine's receipt for one generated turn."""
    return {"digest": digest(ids), "version": version, "weights": weights}


def trajectory_evidence(traj: Trajectory) -> dict[str, Any]:
    """The guard's record of one trajectory (see the module docstring)."""
    receipts = [t.receipt for t in traj.turns]
    samples = traj.training_samples()
    trained = [digest(run) for s in samples for run in mask_runs(s.token_ids, s.loss_mask)]
    # NaN: a turn the engine was not asked to score (rl_factory/backends/verl/sampling_logprobs.py)
    generated = [lp for t in traj.turns for lp in t.logprobs if not math.isnan(lp)]
    results = traj.tool_results
    tool_errors: dict[str, list[int]] = {}  # name -> [calls, errors], calls past the parser only
    for r in results:
        if r.error_kind == "parse":
            continue
        counts = tool_errors.setdefault(r.call.name, [0, 0])
        counts[0] += 1
        counts[1] += r.error_kind is not None
    reward = traj.reward
    return {
        "sample_index": traj.sample_index,
        "reward": None if reward is None or not math.isfinite(reward) else float(reward),
        "reward_finite": reward is None or math.isfinite(reward),
        "advantage_finite": traj.advantage is None or math.isfinite(traj.advantage),
        "engine": [r.get("digest") if r else None for r in receipts],
        "versions": [r.get("version") if r else None for r in receipts],
        "weights": [r.get("weights") if r else None for r in receipts],
        "trained": trained,
        "generated_tokens": sum(len(t.generated_ids) for t in traj.turns),
        "trained_tokens": sum(sum(s.loss_mask) for s in samples),
        "tool_calls": len(traj.tool_calls),
        "parse_errors": sum(r.error_kind == "parse" for r in results),
        "tool_errors": tool_errors,
        # the sampled tokens' surprise: at temperature 1 its mean estimates the policy's entropy
        "neg_logprob_sum": -float(sum(generated)), "neg_logprob_count": len(generated),
    }
