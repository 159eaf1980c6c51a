"""Process rewards: one float per assistant turn, placed on that turn's last generated token.

Two sources, summed: a per-turn function (`reward.process.function: "file.py:fn"`, called once per turn
with the keyword arguments it names from `turn_kwargs`) and a fixed penalty per failed tool call of the
turn (`reward.process.tool_error_penalty`). They are scored by `rewards.scorer.Scorer` (its timeout and
`on_error` apply to the per-turn function too). GAE adds them to the token-level rewards; the outcome
estimators either add their sum to the outcome reward (`outcome_mode: sum`) or ignore them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rewards.loader import _call_dict, _result_dict, load_reward
from rl_factory.base.types import Trajectory

OUTCOME_MODES = ("sum", "ignore")


@dataclass
class ProcessRewardConfig:
    """`reward.process.*`: off unless `function` is set or `tool_error_penalty` is non-zero."""

    function: str | None = None
    tool_error_penalty: float = 0.0
    outcome_mode: str = "sum"


class ProcessReward:
    """`reward.process`: the per-turn function (loaded) and the penalty; `rewards.scorer.Scorer` calls
    them, under the run's executor, timeout and `on_error`, like outcome rewards."""

    def __init__(self, cfg: ProcessRewardConfig):
        if cfg.outcome_mode not in OUTCOME_MODES:
            raise ValueError(f"reward.process.outcome_mode: {cfg.outcome_mode!r} is not one of "
                             f"{', '.join(OUTCOME_MODES)}")
        self.cfg = cfg
        self.fn = load_reward(cfg.function) if cfg.function else None

    @property
    def enabled(self) -> bool:
        return self.fn is not None or self.cfg.tool_error_penalty != 0.0


def turn_kwargs(traj: Trajectory, index: int) -> dict[str, Any]:
    """What a per-turn function may name: text, tool_calls, tool_results, turn_index, num_turns, sample,
    plus the dataset row's columns."""
    turn = traj.turns[index]
    return {**(traj.sample or {}), "text": turn.text, "tool_calls": [_call_dict(c) for c in turn.tool_calls],
            "tool_results": [_result_dict(r) for r in turn.tool_results], "turn_index": index,
            "num_turns": len(traj.turns), "sample": traj.sample}
