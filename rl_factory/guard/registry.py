"""The run guard's checks: a registry of named checks, what a step hands them, and what they find.

A check sees one `StepData` (plain JSON: the step's metrics and one evidence record per trajectory,
rl_factory/guard/evidence.py), keeps what it learned (baselines, streaks) in `state`, and returns its
`guard/` metrics and at most one `Finding`. Everything a check reads or keeps is JSON, so a bundle
(rl_factory/guard/bundle.py) holds enough to run the same check again on the same inputs:
`python -m rl_factory.guard replay <bundle>` rebuilds it from its config slice and state, and a checkpoint
holds every check's `state_dict()` for a resumed run.
"""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from rl_factory.base.registry import Registry

Action = Literal["warn", "stop", "off"]


@dataclass
class StepData:
    """What one step gives the checks (JSON only).

    `trajectories`: evidence records of the trained trajectories; `probes`: the reward probes of this step
    (rl_factory/guard/evidence.py); `files`: path -> fingerprint of the files the run depends on;
    `expected`: what the trainer expects of the engine's receipts (`version`, `weights`), when it knows;
    `late`: evidence of earlier steps' trajectories that this step's update trained (verl's async trainers train
    a rollout steps after it was logged, rl_factory/guard/lines.py): for the `tokens` check only;
    `syncs`: the engine's weight-sync lines since the last step (rl_factory/guard/syncs.py): for `receipts`;
    `partial`: the trajectories are a fraction of the step's batch (verl's async trainers: the lines that finished
    since the last step was logged, a handful at times); the checks that judge a batch's rates (`tools`,
    `reward_constant`, `reward_without_tools`) neither learn from such a step nor fire on it.
    """

    step: int
    metrics: dict[str, Any] = field(default_factory=dict)
    trajectories: list[dict[str, Any]] = field(default_factory=list)
    probes: list[dict[str, Any]] = field(default_factory=list)
    files: dict[str, str] = field(default_factory=dict)
    expected: dict[str, Any] = field(default_factory=dict)
    late: list[dict[str, Any]] = field(default_factory=list)
    syncs: list[dict[str, Any]] = field(default_factory=list)
    partial: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"step": self.step, "metrics": self.metrics, "trajectories": self.trajectories,
                "probes": self.probes, "files": self.files, "expected": self.expected,
                **({"late": self.late} if self.late else {}), **({"syncs": self.syncs} if self.syncs else {}),
                **({"partial": True} if self.partial else {})}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> StepData:
        return cls(**{k: data[k] for k in ("step", "metrics", "trajectories", "probes", "files", "expected", "late",
                                               "syncs", "partial")
                      if k in data})

    def metric(self, key: str) -> float | None:
        """A finite number logged under `key` this step, else None."""
        value = self.metrics.get(key)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            return None
        return float(value)


@dataclass
class Finding:
    """A violation: the check, the step, one line with the numbers, and the trajectories it names."""

    check: str
    step: int
    message: str
    samples: list[int] = field(default_factory=list)  # positions in StepData.trajectories

    def line(self) -> str:
        return f"guard: {self.check} at step {self.step}: {self.message}"


class Check:
    """One family of invariants. Subclasses set `name`, `config` (the slice's dataclass) and `evaluate`."""

    name: ClassVar[str] = ""

    def __init__(self, cfg: Any, state: dict[str, Any] | None = None):
        self.cfg = cfg
        self.state: dict[str, Any] = dict(state or {})

    @property
    def action(self) -> Action:
        return self.cfg.action

    def evaluate(self, data: StepData) -> tuple[dict[str, float], Finding | None]:
        """This step's `guard/<name>/...` metrics, and the violation if there is one."""
        raise NotImplementedError

    def state_dict(self) -> dict[str, Any]:
        """What the check learned (baselines, streaks, fingerprints taken at start): JSON, saved with every
        checkpoint, so a resumed run goes on judging against the same baselines (rl_factory/guard/state.py)."""
        return copy.deepcopy(self.state)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Take a saved `state_dict()` whole: a resumed run neither recomputes a baseline nor restarts a streak."""
        self.state = copy.deepcopy(dict(state))

    def finding(self, data: StepData, message: str, samples: list[int] | None = None) -> Finding:
        return Finding(self.name, data.step, message, list(samples or [])[:16])


CHECKS: Registry[type[Check]] = Registry("guard check")


def register_check(name: str):
    """Class decorator: `@register_check("tokens")` adds the check under its config slice's name."""
    def decorator(cls: type[Check]) -> type[Check]:
        cls.name = name
        return CHECKS.register(name)(cls)
    return decorator


def relative_drop(baseline: float, value: float) -> float:
    """How far `value` fell below `baseline`, as a share of it (0 when it did not fall)."""
    return max(0.0, (baseline - value) / baseline) if baseline > 0 else 0.0
