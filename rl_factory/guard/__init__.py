"""The run guard: end-to-end invariants checked on every training step, on both backends.

A run that goes wrong silently (no tool call ever fires, a weight sync that never lands, sampled and
trained tokens that differ, a reward that ignores the completion, NaNs) is stopped loudly. Each registered
check (rl_factory/guard/checks/) logs its `guard/<check>/...` metrics every step; a violation is one log
line naming the check, the step and the numbers, a bundle in `<run>/guard/` from which
`python -m rl_factory.guard replay <bundle>` reruns the check, and, when the check's action is `stop`,
the end of the run with exit code 3 (`GuardStop`). The report lists every violation.

    guard = build_guard(cfg, run.path, step, policy=policy, agent=agent, scorer=scorer)   # embedded trainer
    metrics.update(await guard.after_step(step, trajs, metrics))
    tracker.log(metrics, step=step); guard.enforce()

The verl backend runs the same checks in its metrics logger (rl_factory/backends/verl/run_dir.py) on the
evidence its agent loop records per trajectory. On both, what the checks learned (`Guard.state_dict()`) is
saved with each checkpoint and restored on resume (rl_factory/guard/state.py).
"""
from __future__ import annotations

import dataclasses

import collections
import copy
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rl_factory.guard.checks.logprobs import LogprobGapConfig
from rl_factory.guard.checks.numerics import EntropyConfig, NumericsConfig
from rl_factory.guard.checks.receipts import ReceiptsConfig
from rl_factory.guard.checks.rewards import (RewardConstantConfig, RewardFilesConfig, RewardProbeConfig,
                                             RewardRangeConfig)
from rl_factory.guard.checks.tokens import TokensConfig
from rl_factory.guard.checks.tools import RewardWithoutToolsConfig, ToolsConfig
from rl_factory.guard.registry import CHECKS, Finding, StepData
from rl_factory.guard.sources import FileWatch, watched_files

log = logging.getLogger("rl_factory")
EXIT_CODE = 3  # a run the guard stopped
STATE_FORMAT = 1  # of `Guard.state_dict()`, as checkpoints hold it


@dataclass
class GuardConfig:
    """`trainer.guard.*`: on/off, the bundle's size, and one slice per check (its action and thresholds)."""

    enabled: bool = True
    window: int = 20
    bundle_trajectories: int = 8
    tokens: TokensConfig = field(default_factory=TokensConfig)
    receipts: ReceiptsConfig = field(default_factory=ReceiptsConfig)
    logprob_gap: LogprobGapConfig = field(default_factory=LogprobGapConfig)
    tools: ToolsConfig = field(default_factory=ToolsConfig)
    reward_without_tools: RewardWithoutToolsConfig = field(default_factory=RewardWithoutToolsConfig)
    reward_constant: RewardConstantConfig = field(default_factory=RewardConstantConfig)
    reward_range: RewardRangeConfig = field(default_factory=RewardRangeConfig)
    reward_probe: RewardProbeConfig = field(default_factory=RewardProbeConfig)
    reward_files: RewardFilesConfig = field(default_factory=RewardFilesConfig)
    numerics: NumericsConfig = field(default_factory=NumericsConfig)
    entropy: EntropyConfig = field(default_factory=EntropyConfig)


class GuardStop(RuntimeError):
    """A check whose action is `stop` fired; the message is its line (exit code 3)."""


class Guard:
    """The checks of one run, their bundles and the stop decision; backend-independent (JSON in, metrics out).

    Args:
        cfg: the `trainer.guard` slice.
        run_dir: where bundles go (`<run_dir>/guard/`).
        config: the run's resolved, redacted config (for config.yaml in bundles and the watched files).
        states: initial state per check name (what the backend knows before the first step).
    """

    def __init__(self, cfg: GuardConfig, run_dir: Path, config: dict[str, Any],
                 states: dict[str, dict[str, Any]] | None = None):
        from rl_factory.guard import checks  # noqa: F401  (registers every check)

        self.cfg, self.run_dir, self.config = cfg, Path(run_dir), config
        self.files = FileWatch(watched_files(config))
        self.facts = dict(states or {})  # what the backend knows of this run: kept over a restored state
        # the files' fingerprints when the run starts (a change during the first step counts too)
        states = {"reward_files": {"start": self.files.fingerprints()}, **self.facts}
        self.checks = [CHECKS[name](getattr(cfg, name), states.get(name)) for name in CHECKS
                       if getattr(cfg, name).action != "off"]
        self.window: collections.deque[dict[str, Any]] = collections.deque(maxlen=max(1, cfg.window))
        self.fingerprints: dict[str, str] = {}  # policy version -> the trainer's weight fingerprint
        self.stops: list[Finding] = []
        self.step = 0  # the last step checked

    def state_dict(self) -> dict[str, Any]:
        """Everything the checks learned, as JSON: each check's `state_dict()`, the trainer's weight fingerprints
        and the metrics window (for later bundles). Saved with each checkpoint (rl_factory/guard/state.py)."""
        return {"format": STATE_FORMAT, "step": self.step, "checks": {c.name: c.state_dict() for c in self.checks},
                "fingerprints": dict(self.fingerprints), "window": list(self.window)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a saved `state_dict()`; a check it does not hold (turned on since) starts afresh. What the backend
        told this run's checks (tools or none, the doctor's verdict, sampled rollouts) stays this run's."""
        if state.get("format") != STATE_FORMAT:
            raise ValueError(f"guard state format {state.get('format')!r}, this version reads {STATE_FORMAT}")
        saved = state.get("checks") or {}
        for check in self.checks:
            if check.name in saved:
                check.load_state_dict({**saved[check.name], **self.facts.get(check.name, {})})
        self.fingerprints = dict(state.get("fingerprints") or {})
        self.window.extend(state.get("window") or [])
        self.step = int(state.get("step") or 0)

    def check(self, data: StepData, records: Callable[[list[int]], list[dict[str, Any]]]) -> dict[str, float]:
        """Run every check on one step; returns the `guard/*` metrics. `records(positions)` gives the rollouts
        lines of those trajectories (for a bundle)."""
        if not data.files:
            data.files = self.files.fingerprints()
        self.step = data.step
        self.window.append({"step": data.step, **data.metrics})
        out: dict[str, float] = {}
        fired = 0
        for check in self.checks:
            before = copy.deepcopy(check.state)
            metrics, finding = check.evaluate(data)
            out.update(metrics)
            if finding is not None:
                fired += 1
                self._violation(check, finding, before, data, records)
        out["guard/violations"] = float(fired)
        return out

    def _violation(self, check, finding: Finding, before: dict[str, Any], data: StepData, records) -> None:
        shown = finding.samples[: self.cfg.bundle_trajectories] or list(range(min(len(data.trajectories),
                                                                                self.cfg.bundle_trajectories)))
        from rl_factory.guard.bundle import write_bundle

        try:
            where = write_bundle(self.run_dir, finding, check.action, check, before, data, records(shown),
                                 list(self.window), self.config, self.fingerprints)
        except OSError as exc:  # the line is what matters; a full disk must not hide it
            where = f"(bundle not written: {exc})"
        log.warning("%s [%s; bundle %s]", finding.line(), check.action, where)
        if check.action == "stop":
            self.stops.append(finding)

    def enforce(self) -> None:
        """Raise `GuardStop` if a `stop` check fired (after the step's metrics are logged)."""
        if self.stops:
            first = self.stops[0]
            from rl_factory.run import RunDir

            RunDir(self.run_dir).write_report()  # with its guard section: the run ends here
            raise GuardStop(f"{first.line()} (trainer.guard.{first.check}.action=stop; bundle in "
                            f"{self.run_dir / 'guard'}; replay: python -m rl_factory.guard replay <bundle>)")


def guard_config(cfg: Any) -> GuardConfig:
    """The `trainer.guard` slice of a parsed config (`RunConfig`), or of a composed one (defaults where it has
    none). With async training (`trainer.max_staleness=k`) a rollout may lag by up to k versions, so the
    receipts allow that much on either backend."""
    from rl_factory.config import section

    trainer = getattr(cfg, "trainer", None)
    if isinstance(getattr(trainer, "guard", None), GuardConfig):
        guard_cfg, ahead = trainer.guard, int(trainer.max_staleness)
    else:
        node = cfg.get("trainer") if hasattr(cfg, "get") else None
        node = node if node is not None and hasattr(node, "get") else {}
        guard_cfg = section({"guard": node.get("guard") or {}}, "guard", GuardConfig)
        ahead = int(node.get("max_staleness") or 0)
    if ahead > guard_cfg.receipts.max_staleness:
        guard_cfg = dataclasses.replace(guard_cfg, receipts=dataclasses.replace(guard_cfg.receipts,
                                                                                 max_staleness=ahead))
    return guard_cfg


def build_guard(cfg: Any, run_dir: Path, step: int, **parts: Any):
    """The embedded trainer's guard (rl_factory/guard/embedded.py), or one that does nothing when off."""
    from rl_factory.guard.embedded import NoGuard, TrainerGuard

    guard_cfg = guard_config(cfg)
    if not guard_cfg.enabled:
        return NoGuard()
    return TrainerGuard(guard_cfg, cfg, run_dir, step, **parts)
