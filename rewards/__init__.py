"""Rewards: the user-function loader, weighted combinations, the scorer and built-in rules.

A reward is a plain function (sync or async) that receives only the keyword arguments it
names; `load_reward("file.py:fn")` turns a spec into a callable `RewardFn`, `build_reward(cfg)`
turns the `reward:` config (one function or several with weights) into the run's `Reward`, and
`RewardScorer` / `score_trajectories` score trajectories with it. Rules: `rewards.rules`.
"""
from rewards.combine import DEFAULT_FUNCTION, Reward, RewardConfig, build_reward
from rewards.exact_match import extract_last_number, numeric_exact_match
from rewards.loader import (
    REWARD_ARGS,
    RewardError,
    RewardFn,
    RewardLoadError,
    RewardTools,
    load_reward,
)
from rewards.scorer import RewardScorer, score_trajectories

__all__ = [
    "DEFAULT_FUNCTION",
    "REWARD_ARGS",
    "Reward",
    "RewardConfig",
    "RewardError",
    "RewardFn",
    "RewardLoadError",
    "RewardScorer",
    "RewardTools",
    "build_reward",
    "extract_last_number",
    "load_reward",
    "numeric_exact_match",
    "score_trajectories",
]
