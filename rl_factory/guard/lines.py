"""The guard over rollouts lines: how the verl backend runs the checks (rl_factory/backends/verl/run_dir.py).

On verl a step's trajectories reach the process that logs the step only as rollouts lines; the agent loop
puts the guard's evidence of each trajectory in its line (`guard`, rl_factory/guard/evidence.py), with the
receipts of verl's server (the weight version `global_steps`, set when an `update_weights` returns) and, from
vLLM's workers, one line per weight sync saying whether the weights they hold changed (rl_factory/guard/syncs.py). The
reward is the line's (scored by verl's reward worker after the evidence was taken). verl updates the
weights after step s with version s, so the rollouts of step s expect version s - 1. The reward probes
and the doctor's tool baseline need the reward and the chat template in this process and are left out
here; the other checks are the embedded trainer's.

The `tokens` check compares the receipts with what the actor trains: verl's trainer hands this guard, per step, the
digests of the batch it gives the actor (`trained`, from rl_factory/backends/verl/trained.py, keyed by the
evidence's `session_key`), and those replace the agent loop's own trained side of each line (`trained_in: "actor
batch"`). A line no batch holds yet waits up to `horizon` steps (verl's async trainers train a rollout after its
step was logged): it is counted untrained at its step and judged, as `late` evidence, at the step that trains it.
A step the trainer handed nothing for (the guard's batch read off, a step re-checked after a resume) is judged on
the agent loop's side, as before.

The checks' state goes with verl's checkpoints (rl_factory/guard/state.py): verl saves step N's checkpoint
before it logs step N, so once this guard has checked step N it writes `global_step_N/guard_state.json` into
the checkpoint verl just saved, and `guard/state.json` (the latest step's) into the run directory. A run resumed
from checkpoint N takes the first; one killed between verl's save and the log of step N finds no state there,
takes `guard/state.json` of step N - 1 and checks step N again when the logger recovers that step.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from rl_factory.guard import Guard, guard_config
from rl_factory.guard.bundle import GUARD_DIR
from rl_factory.guard.registry import StepData
from rl_factory.guard.state import STATE_FILE, read_state, restore, write_state
from rl_factory.guard.syncs import SYNCS_DIR
from rl_factory.jsonl import Tail

LATEST_FILE = "state.json"  # <run>/guard/state.json: the state after the latest step checked


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
        self.latest = Path(out_dir) / GUARD_DIR / LATEST_FILE
        self.pending: int | None = None  # a resumed step whose checks run again (its state was not saved)
        self.wants_batch = self.enabled and self.cfg.tokens.action != "off"
        self.horizon = self.cfg.receipts.max_staleness + 2  # steps a line waits for the batch that trains it
        self.asynchronous = int(run.trainer.max_staleness) > 0  # verl's async trainers (backends/verl/asynchrony.py)
        # under them a step's lines are those that finished since the last log: fewer than half a batch is `partial`
        self.half_batch = int(run.data.train_batch_size) * int(run.rollout.n) / 2
        self.batches: dict[int, dict[str, dict[str, Any]]] = {}  # step -> session_key -> what the actor trained
        self.waiting: dict[str, tuple[int, dict[str, Any]]] = {}  # session_key -> (its step, evidence): not yet trained
        self.syncs = Tail(Path(out_dir) / SYNCS_DIR)  # vLLM's own receipts of each weight sync (guard/syncs.py)

    def resume(self, checkpoints: Path, step: int) -> None:
        """Continue from the state saved with verl's checkpoint of `step` (`global_step_<step>`), else from the
        run directory's latest state if it is step - 1's (then `pending` is `step`: check it again)."""
        if self.guard is None:
            return
        saved = Path(checkpoints) / f"global_step_{step}" / STATE_FILE
        if saved.is_file():
            restore(self.guard, saved, f"checkpoint {saved.parent}")
            return
        latest = read_state(self.latest)
        if latest is None and step == 1:  # killed before the first step was logged: the start's state is exact
            self.pending = step
        elif latest is not None and latest.get("step") == step - 1 and restore(self.guard, self.latest, "the run"):
            self.pending = step
        else:
            restore(self.guard, saved, f"checkpoint {saved.parent}")  # says that there is none

    def save(self, step: int, checkpoints: Path) -> None:
        """After checking `step`: the run's latest state, and the state of verl's checkpoint of `step` if it saved
        one (it saves before it logs the step)."""
        if self.guard is None:
            return
        state = self.guard.state_dict()
        self.latest.parent.mkdir(parents=True, exist_ok=True)
        write_state(self.latest, state)
        point = Path(checkpoints) / f"global_step_{step}"
        if point.is_dir():
            write_state(point / STATE_FILE, state)

    def after_step(self, step: int, metrics: dict[str, Any], lines: list[dict[str, Any]]) -> dict[str, float]:
        """The step's guard/* metrics (violations logged and bundled); {} when off or nothing was trained."""
        if self.guard is None:
            return {}
        where = [i for i, line in enumerate(lines) if isinstance(line.get("guard"), dict)]
        if not where:
            return {}
        evidence = [_with_reward(lines[i], step) for i in where]
        late = self._join(step, evidence, [lines[i] for i in where]) if step in self.batches else []
        # the newest version a line can carry: step s's update lands (version s) before s is logged, and under an
        # async trainer the rollouts it paused resume with it, so a line that finished in between holds version s
        newest = step if self.asynchronous else step - 1
        syncs = [x for x in self.syncs.read() if isinstance(x, dict)] if self.cfg.receipts.action != "off" else []
        data = StepData(step, metrics=dict(metrics), trajectories=evidence, late=late,
                        expected={"version": step - 1, "newest": newest}, syncs=syncs,
                        partial=self.asynchronous and len(evidence) < self.half_batch)
        return self.guard.check(data, lambda positions: [lines[where[p]] for p in positions if p < len(where)])

    def trained(self, step: int, rows: dict[str, dict[str, Any]]) -> None:
        """What the actor is handed at `step`, per `session_key` (`trained`, `trained_tokens`); verl's trainer calls it
        once per update (several with `parameter_sync_step` > 1)."""
        self.batches.setdefault(step, {}).update(rows)

    def _join(self, step: int, evidence: list[dict[str, Any]], lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The batches' trained side in place of the agent loop's, in `evidence` (in place); returns the evidence of
        earlier lines that this step's batch trained (`late`)."""
        rows = {k: v for s in sorted(self.batches) if s <= step for k, v in self.batches.pop(s).items()}
        for ev, line in zip(evidence, lines):
            ev["session"] = line.get("session", 0)
            if line.get("dropped_by"):
                ev["dropped_by"] = line["dropped_by"]
            key = ev.get("session_key")
            if key is None:  # a line without verl's key (written by an older agent loop): the loop's side
                continue
            if key in rows:
                ev.update(rows.pop(key), trained_in="actor batch")
            else:  # not trained (yet): an async trainer trains it later, dynamic sampling evicted its group
                self.waiting[key] = (step, dict(ev))
                ev.update(trained=None, trained_tokens=0, trained_in=None)
        late = []
        for key in [k for k in rows if k in self.waiting]:
            rolled_out, ev = self.waiting.pop(key)
            late.append({**ev, **rows.pop(key), "trained_in": "actor batch", "rolled_out": rolled_out})
        if rows:  # batch rows whose line has not been logged yet: kept for the step that logs it
            self.batches.setdefault(step, {}).update(rows)
        for key in [k for k, (s, _) in self.waiting.items() if s <= step - self.horizon]:
            del self.waiting[key]
        for old in [s for s in self.batches if s <= step - self.horizon]:
            del self.batches[old]
        return late

    def enforce(self) -> None:
        if self.guard is not None:
            self.guard.enforce()


def _with_reward(line: dict[str, Any], step: int) -> dict[str, Any]:
    """The line's evidence, its reward, and the oldest version it may carry: its prompt was queued at its `step`
    (verl tags each prompt with the step that queued it), after the update of the step before had landed."""
    reward = line.get("reward")
    finite = reward is None or (isinstance(reward, (int, float)) and math.isfinite(reward))
    queued = line.get("step") if isinstance(line.get("step"), int) else step
    return {**line["guard"], "reward": float(reward) if reward is not None and finite else None, "reward_finite": finite,
            "oldest_version": queued - 1}
