"""Rewards: the user-function loader, weighted combinations, the scorer and built-in rules.

A reward is a plain function (sync or async) that receives only the keyword arguments it
names; `load_reward("file.py:fn")` turns a spec into a callable `RewardFn`, `build_scorer(cfg)`
turns the `reward:` config (one function or several with weights, process rewards, executor,
timeout, on_error) into the run's `Scorer`, the one path every reward call goes through, and
`score_trajectories` scores a finished batch with it. Rules: `rewards.rules`.
"""
from rewards.combine import DEFAULT_FUNCTION, RewardConfig
from rewards.exact_match import extract_last_number, numeric_exact_match
from rewards.loader import (
    REWARD_ARGS,
    RewardError,
    RewardFn,
    RewardLoadError,
    RewardTools,
    load_reward,
)
from rewards.scorer import Scorer, build_scorer, score_trajectories

__all__ = [
    "DEFAULT_FUNCTION",
    "REWARD_ARGS",
    "RewardConfig",
    "RewardError",
    "RewardFn",
    "RewardLoadError",
    "RewardTools",
    "Scorer",
    "build_scorer",
    "extract_last_number",
    "load_reward",
    "numeric_exact_match",
    "score_trajectories",
]
