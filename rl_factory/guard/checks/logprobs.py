"""Sampling vs training log-probs: the gap between what the engine recorded and what the update computes.

Split by cause where the backend can: at staleness 0 (the update's first optimizer step, on the weights that
sampled) the gap is numerics alone (kernels, precision); after an optimizer step it also holds staleness.
Each cause is measured against its own baseline, the mean of its first `baseline_steps` steps, and a step
whose gap passes both `max_ratio` times the baseline and the baseline plus `min_jump` fires. An engine that
samples with other weights than the trainer's (a sync that never landed) shows here as a numerics gap that
grows with every update.
"""
from __future__ import annotations

from dataclasses import dataclass

from rl_factory.guard.registry import Action, Check, StepData, register_check

# cause -> the metrics that measure it, first found wins: ours (rl_factory/update.py), then verl's
GAP_METRICS = {
    "numerics": ("actor/logprob_gap", "training/rollout_probs_diff_mean", "actor/rollout_probs_diff_mean"),
    "staleness": ("actor/logprob_gap_stale",),
}


@dataclass
class LogprobGapConfig:
    action: Action = "warn"
    # steps whose gap makes the baseline
    baseline_steps: int = 3
    # a gap this many times its baseline ...
    max_ratio: float = 10.0
    # ... and at least this much above it (nats per token; probability for verl's diff metric) fires
    min_jump: float = 0.05


@register_check("logprob_gap")
class LogprobGapCheck(Check):
    config = LogprobGapConfig

    def evaluate(self, data: StepData):
        metrics, worst = {}, None
        for cause, keys in GAP_METRICS.items():
            key = next((k for k in keys if data.metric(k) is not None), None)
            if key is None:
                continue
            value = data.metric(key)
            seen = self.state.setdefault(cause, [])
            name = "guard/logprob_gap" if cause == "numerics" else f"guard/logprob_gap/{cause}"
            metrics[name] = value
            if len(seen) < self.cfg.baseline_steps:
                seen.append(value)
                continue
            baseline = sum(seen) / len(seen)
            metrics[f"{name}/baseline"] = baseline
            limit = max(baseline * self.cfg.max_ratio, baseline + self.cfg.min_jump)
            if value > limit and worst is None:
                worst = (f"the {cause} gap between sampling and training log-probs ({key}) is {value:.4g}, "
                         f"{value / baseline if baseline else float('inf'):.3g}x its baseline {baseline:.4g} over the "
                         f"first {len(seen)} steps (limit {limit:.4g})")
        return metrics, None if worst is None else self.finding(data, worst)
