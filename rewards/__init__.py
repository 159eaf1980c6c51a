"""Rewards: the user-function loader and built-in rule rewards.

A reward is a plain function (sync or async) that receives only the keyword arguments it
names; `load_reward("file.py:fn")` turns a spec into a callable `RewardFn`.
"""
from rewards.exact_match import extract_last_number, numeric_exact_match
from rewards.loader import (
    REWARD_ARGS,
    RewardError,
    RewardFn,
    RewardLoadError,
    load_reward,
    score_trajectories,
)

__all__ = [
    "REWARD_ARGS",
    "RewardError",
    "RewardFn",
    "RewardLoadError",
    "extract_last_number",
    "load_reward",
    "numeric_exact_match",
    "score_trajectories",
]
