"""Numerics: non-finite loss, gradient norm or advantages, and entropy collapse.

The update already refuses a non-finite optimizer step (rl_factory/update.py `NonFiniteGuard`: the step is
skipped and counted in `update/skipped_nonfinite`, and `optim.max_nonfinite_steps` in a row stop the run);
this check makes each such step a named violation with a bundle. Entropy is estimated from what was
sampled (the mean surprise of the sampled tokens at the rollout temperature), unless the backend logs
its own (`actor/entropy`, verl); under `floor` it fires.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from rl_factory.guard.registry import Action, Check, StepData, register_check

NONFINITE_METRICS = ("actor/loss", "actor/grad_norm", "actor/pg_loss")


@dataclass
class NumericsConfig:
    action: Action = "warn"


@dataclass
class EntropyConfig:
    action: Action = "warn"
    # nats per sampled token; 0 turns it off
    floor: float = 0.002


@register_check("numerics")
class NumericsCheck(Check):
    config = NumericsConfig

    def evaluate(self, data: StepData):
        bad = [k for k in NONFINITE_METRICS if _nonfinite(data.metrics.get(k))]
        skipped = data.metric("update/skipped_nonfinite") or 0.0
        advantages = [i for i, ev in enumerate(data.trajectories) if not ev.get("advantage_finite", True)]
        metrics = {"guard/numerics/nonfinite": float(len(bad) + (skipped > 0) + len(advantages))}
        if not (bad or skipped or advantages):
            return metrics, None
        parts = []
        if skipped:
            parts.append(f"{skipped:g} optimizer step(s) skipped for a non-finite loss or gradient norm")
        parts += [f"{k} = {data.metrics[k]}" for k in bad]
        if advantages:
            parts.append(f"{len(advantages)} trajectories with a non-finite advantage")
        return metrics, self.finding(data, "; ".join(parts), advantages)


def _nonfinite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isfinite(value)


@register_check("entropy")
class EntropyCheck(Check):
    config = EntropyConfig

    def evaluate(self, data: StepData):
        entropy = data.metric("actor/entropy")
        if entropy is None:
            total = sum(ev.get("neg_logprob_sum", 0.0) for ev in data.trajectories)
            count = sum(ev.get("neg_logprob_count", 0) for ev in data.trajectories)
            if not count or not self.state.get("sampled", True):  # greedy rollouts: no estimate
                return {}, None
            entropy = total / count
        metrics = {"guard/entropy": entropy}
        if self.cfg.floor <= 0 or entropy >= self.cfg.floor:
            return metrics, None
        return metrics, self.finding(data, f"policy entropy {entropy:.4g} nats per token is under the floor "
                                           f"{self.cfg.floor:g}: the policy has collapsed")
