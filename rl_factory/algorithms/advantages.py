"""Outcome-reward advantage estimators, one pure function each, behind the `ADVANTAGES` registry.

Every estimator has the same signature, so the trainer resolves a name once and calls it:

    fn(rewards: Tensor[N] float64, group_index: Tensor[N] long, **options) -> Tensor[N]

`group_index` numbers the groups 0..G-1 (trajectories of one prompt share a group). The
advantage of a trajectory is broadcast to all its generated tokens by the loss, which is why
estimators return one value per trajectory. Add one with `@register_advantage("name")`.

GRPO (Shao et al., 2024, DeepSeekMath) departures, each chosen to match verl where verl has an
opinion and to be safe where it does not:
- std is the *unbiased* (n-1) sample std, as `torch.std` in verl's
  `compute_grpo_outcome_advantage`; the paper does not specify. With n=2 and rewards {0, 1}
  this gives +-0.707 instead of +-1.
- a group of size 1 gets advantage 0 (it has no baseline to compare against); verl instead
  sets mean 0, std 1 there, so a lone trajectory's advantage equals its raw reward.
- `epsilon` is added to the std (not the variance), so a zero-variance group gets exactly 0.
- `norm_by_std=False` gives the Dr. GRPO (Liu et al., 2025) mean-centred advantage.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from rl_factory.types import Group

AdvantageFn = Callable[..., torch.Tensor]
ADVANTAGES: dict[str, AdvantageFn] = {}


def register_advantage(name: str) -> Callable[[AdvantageFn], AdvantageFn]:
    """Decorator adding an estimator to `ADVANTAGES` under `name`; a taken name is an error."""

    def decorator(fn: AdvantageFn) -> AdvantageFn:
        if name in ADVANTAGES:
            raise ValueError(f"advantage estimator {name!r} is already registered "
                             f"(by {ADVANTAGES[name].__module__}.{ADVANTAGES[name].__qualname__})")
        ADVANTAGES[name] = fn
        return fn

    return decorator


def get_advantage(name: str) -> AdvantageFn:
    """The estimator registered as `name`; KeyError listing the valid names otherwise."""
    if name not in ADVANTAGES:
        raise KeyError(f"unknown advantage estimator {name!r}; valid: {sorted(ADVANTAGES)}")
    return ADVANTAGES[name]


def compute_advantages(name: str, rewards: Any, group_ids: Any, **options: Any) -> torch.Tensor:
    """Per-trajectory advantages from outcome rewards with the estimator registered as `name`.

    Args:
        name: registry key, e.g. "grpo".
        rewards: [N] tensor, numpy array or list of floats, one per trajectory.
        group_ids: [N] group labels (ints or strings, any order; equal label = same prompt).
        **options: estimator options, e.g. `norm_by_std`, `epsilon` for "grpo".

    Returns:
        [N] float32 advantages, on the device of `rewards` if it was a tensor.
    """
    fn = get_advantage(name)
    values = torch.as_tensor(rewards, dtype=torch.float64)
    if values.dim() != 1:
        raise ValueError("rewards must be 1-D (one per trajectory), "
                         f"got shape {tuple(values.shape)}")
    bad = (~torch.isfinite(values)).nonzero().flatten().tolist()
    if bad:
        raise ValueError(f"rewards at indices {bad[:10]} are not finite")
    group_index = _group_index(group_ids, device=values.device)
    if group_index.numel() != values.numel():
        raise ValueError(f"got {values.numel()} rewards but {group_index.numel()} group ids")
    if values.numel() == 0:
        return torch.zeros(0, dtype=torch.float32, device=values.device)
    return fn(values, group_index, **options).to(torch.float32)


def assign_advantages(name: str, groups: Sequence[Group], **options: Any) -> torch.Tensor:
    """Compute advantages for scored groups and store each on `trajectory.advantage`.

    Returns:
        [N] float32 advantages in group-then-trajectory order.
    """
    trajs = [t for g in groups for t in g.trajectories]
    unscored = [t.sample_index for t in trajs if t.reward is None]
    if unscored:
        raise ValueError(f"trajectories of samples {sorted(set(unscored))[:10]} have no reward yet")
    group_ids = [gi for gi, g in enumerate(groups) for _ in g.trajectories]
    advantages = compute_advantages(name, [t.reward for t in trajs], group_ids, **options)
    for traj, adv in zip(trajs, advantages.tolist(), strict=True):
        traj.advantage = adv
    return advantages


def _group_index(group_ids: Any, device: torch.device) -> torch.Tensor:
    """Map arbitrary hashable group labels to 0..G-1 in order of first appearance. [N] long."""
    labels = group_ids.tolist() if hasattr(group_ids, "tolist") else list(group_ids)
    first_seen: dict[Any, int] = {}
    index = [first_seen.setdefault(label, len(first_seen)) for label in labels]
    return torch.tensor(index, dtype=torch.long, device=device)


def group_stats(values: torch.Tensor, group_index: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-trajectory statistics of each trajectory's own group.

    Args:
        values: [N] float.
        group_index: [N] long in 0..G-1.

    Returns:
        (mean, unbiased std, size), each [N]; the std of a group of size 1 is 0.
    """
    num_groups = int(group_index.max()) + 1
    size = torch.bincount(group_index, minlength=num_groups).to(values.dtype)  # [G]
    mean = torch.zeros(num_groups, dtype=values.dtype, device=values.device)
    mean = mean.index_add(0, group_index, values) / size  # [G]
    sq_dev = (values - mean[group_index]) ** 2  # [N]
    var = torch.zeros_like(mean).index_add(0, group_index, sq_dev) / (size - 1).clamp(min=1)
    return mean[group_index], var.sqrt()[group_index], size[group_index]


@register_advantage("grpo")
def compute_grpo_advantage(rewards: torch.Tensor, group_index: torch.Tensor,
                           norm_by_std: bool = True, epsilon: float = 1e-6) -> torch.Tensor:
    """GRPO: each reward z-scored within its group (see the module docstring for details).

    Args:
        rewards: [N] float.
        group_index: [N] long in 0..G-1.
        norm_by_std: divide by the group std (False: only subtract the group mean).
        epsilon: added to the std to avoid division by zero.

    Returns:
        [N] advantages; 0 for groups of size 1.
    """
    mean, std, size = group_stats(rewards, group_index)
    advantages = rewards - mean
    if norm_by_std:
        advantages = advantages / (std + epsilon)
    return torch.where(size > 1, advantages, torch.zeros_like(advantages))
