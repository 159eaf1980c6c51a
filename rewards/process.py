"""Process rewards: one float per assistant turn, placed on that turn's last generated token.

Two sources, summed: a per-turn function (`reward.process.function: "file.py:fn"`, called once per turn
with the keyword arguments it names from `turn_kwargs`) and a fixed penalty per failed tool call of the
turn (`reward.process.tool_error_penalty`). GAE adds them to the token-level rewards; the outcome
estimators either add their sum to the outcome reward (`outcome_mode: sum`) or ignore them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rewards.loader import RewardError, _call_dict, _result_dict, load_reward
from rl_factory.types import Trajectory

OUTCOME_MODES = ("sum", "ignore")


@dataclass
class ProcessRewardConfig:
    """`reward.process.*`: off unless `function` is set or `tool_error_penalty` is non-zero."""

    function: str | None = None
    tool_error_penalty: float = 0.0
    outcome_mode: str = "sum"


class ProcessReward:
    """Per-turn rewards; a raising per-turn function follows `reward.on_error` like outcome rewards."""

    def __init__(self, cfg: ProcessRewardConfig, on_error: str = "raise"):
        if cfg.outcome_mode not in OUTCOME_MODES:
            raise ValueError(f"reward.process.outcome_mode: {cfg.outcome_mode!r} is not one of "
                             f"{', '.join(OUTCOME_MODES)}")
        if on_error not in ("raise", "zero"):
            raise ValueError(f"reward.on_error: {on_error!r} is not one of raise, zero")
        self.cfg, self.on_error = cfg, on_error
        self.fn = load_reward(cfg.function) if cfg.function else None
        self.errors = 0  # per-turn function failures scored 0 under on_error=zero (reward/process/errors)

    @property
    def enabled(self) -> bool:
        return self.fn is not None or self.cfg.tool_error_penalty != 0.0

    async def score(self, traj: Trajectory) -> list[float]:
        """One reward per turn of `traj` (also stored on `traj.process_rewards`)."""
        rewards = []
        for i, turn in enumerate(traj.turns):
            failed = sum(not res.ok for res in turn.tool_results)
            r = self.cfg.tool_error_penalty * failed if failed else 0.0
            if self.fn is not None:
                try:
                    r += self.fn.to_score(await self.fn(**turn_kwargs(traj, i)))[0]
                except Exception as exc:
                    if self.on_error == "zero":
                        self.errors += 1
                        rewards.append(float(r))
                        continue
                    raise RewardError(f"process reward {self.fn.name} failed on sample {traj.sample_index} "
                                      f"turn {i}: {type(exc).__name__}: {exc}") from exc
            rewards.append(float(r))
        traj.process_rewards = rewards
        return rewards

    def outcome(self, traj: Trajectory) -> float:
        """The reward an outcome estimator sees: the outcome plus (outcome_mode=sum) the process rewards."""
        extra = sum(traj.process_rewards) if self.cfg.outcome_mode == "sum" else 0.0
        return float(traj.reward or 0.0) + extra


def turn_kwargs(traj: Trajectory, index: int) -> dict[str, Any]:
    """What a per-turn function may name: text, tool_calls, tool_results, turn_index, num_turns, sample,
    plus the dataset row's columns."""
    turn = traj.turns[index]
    return {**(traj.sample or {}), "text": turn.text, "tool_calls": [_call_dict(c) for c in turn.tool_calls],
            "tool_results": [_result_dict(r) for r in turn.tool_results], "turn_index": index,
            "num_turns": len(traj.turns), "sample": traj.sample}
