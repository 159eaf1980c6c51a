"""The guard over rollouts lines: how the verl backend runs the checks (rl_factory/backends/verl/run_dir.py).

On verl a step's trajectories reach the process that logs the step only as rollouts lines; the agent loop
puts the guard's evidence of each trajectory in its line (`guard`, rl_factory/guard/evidence.py), with the
receipts of verl's server (the weight version `global_steps`, set when an `update_weights` lands). The
reward is the line's (scored by verl's reward worker after the evidence was taken). verl updates the
weights after step s with version s, so the rollouts of step s expect version s - 1. The reward probes
and the doctor's tool baseline need the reward and the chat template in this process and are left out
here; the other checks are the embedded trainer's.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from rl_factory.guard import Guard, guard_config
from rl_factory.guard.registry import StepData


class LineGuard:
    """The checks of a run whose step arrives as rollouts lines plus the backend's metrics.

    Args:
        ours: our config, parsed (`RunConfig`) or as the `rl_factory` node of verl's (parsed here).
        out_dir: the run directory.
    """

    def __init__(self, ours: Any, out_dir: Path):
        from rl_factory.config import redacted

        from rl_factory.config import RunConfig, parse

        run = ours if isinstance(ours, RunConfig) else parse(ours)
        self.cfg = guard_config(run)
        self.enabled = self.cfg.enabled
        has_tools = bool(run.env.tools)
        states = {"tools": {"has_tools": has_tools}, "reward_without_tools": {"has_tools": has_tools},
                  "entropy": {"sampled": float(run.rollout.temperature) > 0}}
        self.guard = Guard(self.cfg, out_dir, redacted(run.composed), states) if self.enabled else None

    def after_step(self, step: int, metrics: dict[str, Any], lines: list[dict[str, Any]]) -> dict[str, float]:
        """The step's guard/* metrics (violations logged and bundled); {} when off or nothing was trained."""
        if self.guard is None:
            return {}
        where = [i for i, line in enumerate(lines) if isinstance(line.get("guard"), dict)]
        if not where:
            return {}
        evidence = [_with_reward(lines[i]) for i in where]
        data = StepData(step, metrics=dict(metrics), trajectories=evidence, expected={"version": step - 1})
        return self.guard.check(data, lambda positions: [lines[where[p]] for p in positions if p < len(where)])

    def enforce(self) -> None:
        if self.guard is not None:
            self.guard.enforce()


def _with_reward(line: dict[str, Any]) -> dict[str, Any]:
    reward = line.get("reward")
    finite = reward is None or (isinstance(reward, (int, float)) and math.isfinite(reward))
    return {**line["guard"], "reward": float(reward) if reward is not None and finite else None, "reward_finite": finite}
