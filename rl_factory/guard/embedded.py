"""The guard in the embedded trainer: evidence from live trajectories, reward probes, and the weight sync.

"Weight sync" on the embedded backend is the shared model: the engine generates with the trainer's own
`policy.model`. After every update the trainer syncs the engine anyway (`HFEngine.sync(version)`), and the
engine fingerprints the weights *it* holds; the trainer fingerprints its own. An engine that kept its
initial weights (a copy made at start) stamps its turns with a fingerprint the trainer's weights left
behind at the first update, which the `receipts` check names. Under LoRA the fingerprint also holds the
adapter's state (enabled, active, scaling) that the engine's forwards run with (rl_factory/engines/hf_batch.py).

On resume the checks' state comes back from the checkpoint (`guard_state.json`, rl_factory/guard/state.py),
with the trainer's fingerprint of the version saved there: weights that load back other than they were saved
are named by the `receipts` check at the first step after the resume.
"""
from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from rl_factory.guard import Guard, GuardConfig
from rl_factory.guard.fingerprint import weight_fingerprint
from rl_factory.guard.evidence import trajectory_evidence
from rl_factory.guard.probes import run_probes
from rl_factory.guard.registry import StepData
from rl_factory.guard.state import STATE_FILE, restore
from rl_factory.base.types import Trajectory

log = logging.getLogger("rl_factory")


class NoGuard:
    """`trainer.guard.enabled=false`."""

    async def after_step(self, step: int, trajs: list[Trajectory], metrics: dict[str, Any]) -> dict[str, float]:
        return {}

    def enforce(self) -> None:
        return None

    def checkpoint_files(self) -> dict[str, Any]:
        return {}


class TrainerGuard:
    """The embedded trainer's guard (rl_factory/guard/__init__.py shows the calls).

    Args:
        cfg: the `trainer.guard` slice; config: the parsed config (`RunConfig`; its `composed` goes into bundles).
        run_dir: the run directory; step: the step the run starts after (0, or the resumed checkpoint's).
        policy, agent, scorer: the trainer's (the engine is `agent.engine`).
        resume_from: the checkpoint the run resumed from, whose guard state the checks continue from.
    """

    def __init__(self, cfg: GuardConfig, config: Any, run_dir: Path, step: int, *, policy: Any, agent: Any,
                 scorer: Any, resume_from: Path | None = None):
        from rl_factory.config import redacted

        self.cfg, self.policy, self.agent, self.scorer = cfg, policy, agent, scorer
        tools = list(getattr(agent.env, "tools", None) or [])
        states = {name: {"has_tools": bool(tools)} for name in ("tools", "reward_without_tools")}
        if tools:
            states["tools"]["doctor"] = _doctor_round_trip(agent, tools, str(config.env.parser))
        states["entropy"] = {"sampled": float(config.rollout.temperature) > 0}
        self.guard = Guard(cfg, run_dir, redacted(config.composed), states)
        self.resumed: dict[str, Any] | None = None  # the resumed version's saved vs loaded fingerprint, if they differ
        if resume_from is not None:
            restore(self.guard, Path(resume_from) / STATE_FILE, f"checkpoint {resume_from}")
        self.sync(step)

    def sync(self, version: int) -> None:
        """The trainer's fingerprint of `version`, and the engine told to sync to it (it fingerprints its own)."""
        self.version = version
        keep = {str(v) for v in range(version - self.cfg.receipts.max_staleness, version + 1)}
        prints = {k: v for k, v in self.guard.fingerprints.items() if k in keep}
        mine, saved = weight_fingerprint(self.policy.model), prints.get(str(version))
        if saved is not None and saved != mine:  # resumed: the checkpoint's weights, as saved, stay the expected ones
            self.resumed = {"version": version, "saved": saved, "loaded": mine}
        else:
            prints[str(version)] = mine
        self.guard.fingerprints = prints
        engine_sync = getattr(self.agent.engine, "sync", None)
        if engine_sync is not None:
            engine_sync(version)

    async def after_step(self, step: int, trajs: list[Trajectory], metrics: dict[str, Any]) -> dict[str, float]:
        """Check the step's trained trajectories and metrics; then sync the engine for the next step."""
        start = time.perf_counter()
        probe_cfg = self.cfg.reward_probe
        probes = []
        if probe_cfg.action != "off" and probe_cfg.every and step % probe_cfg.every == 0:
            probes = await run_probes(self.scorer, trajs, probe_cfg.per_step, offset=step)
        data = StepData(step, metrics=dict(metrics), trajectories=[trajectory_evidence(t) for t in trajs],
                        probes=probes, expected={"version": self.version, "weights": dict(self.guard.fingerprints),
                                                 **({"resumed": self.resumed} if self.resumed else {})})
        out = self.guard.check(data, lambda positions: _records(trajs, positions))
        self.sync(step)
        out["timing/guard_s"] = time.perf_counter() - start
        return out

    def enforce(self) -> None:
        self.guard.enforce()

    def checkpoint_files(self) -> dict[str, Any]:
        """`guard_state.json` for the checkpoint the trainer saves after this step."""
        return {STATE_FILE: self.guard.state_dict()}


def _records(trajs: list[Trajectory], positions: list[int]) -> list[dict[str, Any]]:
    from rl_factory.evaluate import trajectory_record

    return [trajectory_record(trajs[i]) for i in positions if 0 <= i < len(trajs)]


def _doctor_round_trip(agent: Any, tools: list[dict], parser: str) -> dict[str, Any]:
    """The doctor's verdict on the parser reading back the chat template's calls (the tool-rate baseline)."""
    from rl_factory.doctor.template import check_parser_round_trip

    try:
        found = check_parser_round_trip(agent.fmt, tools, parser)
    except Exception as exc:  # noqa: BLE001 - a baseline we cannot take is no baseline, not a failed run
        log.debug("guard: the doctor's parser round trip did not run: %s", exc)
        return {}
    return {"ok": found.ok, "detail": found.detail, "fix": found.fix}
