"""The run guard's state in a checkpoint: `guard_state.json`, so a resumed run judges against the same baselines.

What the checks learn lives in memory: the first steps' log-prob gap and tool rates (their baselines), streaks
("constant reward for N steps in a row"), the fingerprints of the reward and data files taken when the run
started, the trainer's weight fingerprints. Started afresh after a resume, a run whose tool-call rate had
collapsed would take the collapsed rate as its new baseline, and a reward file rewritten before the kill would
be fingerprinted again as it is now. So `Guard.state_dict()` (every check's `state_dict()`, through the
registry) goes into the checkpoint directory and `Guard.load_state_dict()` takes it back:

- embedded: `checkpoints/step_NNNNNN/guard_state.json`, written with the checkpoint (the guard checked step N
  before the trainer saves it);
- verl: `checkpoints/global_step_N/guard_state.json`, written by our metrics logger when it checks step N: verl
  saves step N's checkpoint *before* it validates and logs step N, so the file joins the checkpoint a moment
  later (rl_factory/backends/verl/run_dir.py). The logger also keeps the latest state in `guard/state.json`: a
  run killed between verl's save and the log resumes from the state of step N - 1 and checks step N again
  from its rollouts.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from rl_factory.base.files import write_atomic

log = logging.getLogger("rl_factory")
STATE_FILE = "guard_state.json"


def to_json(state: dict[str, Any]) -> str:
    """The state as JSON text; a value JSON cannot hold (a numpy number in a metrics window) as a float or text."""
    return json.dumps(state, default=_plain, allow_nan=True)


def _plain(value: Any) -> Any:
    try:
        return float(value)
    except (TypeError, ValueError):
        return str(value)


def write_state(path: Path, state: dict[str, Any]) -> None:
    """Write `state` to `path` whole or not at all (a temporary file renamed into place)."""
    write_atomic(path, to_json(state))


def read_state(path: Path) -> dict[str, Any] | None:
    """The state saved at `path`, or None when there is none; an unreadable one is said in one line."""
    path = Path(path)
    if not path.is_file():
        return None
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        log.warning("guard: the saved guard state %s cannot be read (%s): its checks start afresh", path, exc)
        return None
    return state if isinstance(state, dict) else None


def restore(guard: Any, path: Path, where: str) -> bool:
    """Load the state saved at `path` into `guard` (a `Guard`); False, with one line, when there is none."""
    state = read_state(path)
    if state is None:
        log.warning("guard: %s holds no guard state (%s): the checks' baselines, streaks and start fingerprints "
                    "start afresh", where, path.name)
        return False
    try:
        guard.load_state_dict(state)
    except (ValueError, TypeError, KeyError) as exc:
        log.warning("guard: the guard state in %s does not load (%s): its checks start afresh", where, exc)
        return False
    log.info("guard: restored the checks' state of step %s from %s", state.get("step"), path)
    return True
