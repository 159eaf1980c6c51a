"""Advantage estimators, one pure function each, behind the `ADVANTAGES` registry.

Every estimator takes the same input, so the trainer resolves a name once and calls it at one site:

    fn(inputs: AdvantageInputs, **options) -> Tensor[N] (outcome estimators) or Tensor[N, T] (token level)

`AdvantageInputs` carries rewards [N] and group indices [N] (0..G-1; trajectories of one prompt share a
group) and, for the estimators that need them, token-level rewards / values / response mask [N, T] and
tournament scores [N]. An estimator declares what it needs when it registers
(`@register_advantage("gae", requires=("values", "response_mask"), uses=("token_rewards",))`: `requires`
it cannot work without, `uses` it reads when given); a missing input is a clear error. Who fills each
input is not this module's business: the trainer looks up one provider per declared input
(rl_factory/providers.py), and a new input is declared with `register_input` by its provider. Outcome
estimators return one value per trajectory, which the loss broadcasts to the trajectory's generated tokens.
An estimator that trains a critic also declares how the critic's targets follow from its own
computation (`VALUE_TARGETS`; gae's: the unwhitened advantages plus the values).

Built-ins and where they depart from their papers (each chosen to match verl where verl has an opinion
and to be safe where it does not):
- `grpo` (Shao et al., 2024): reward z-scored within its group. The std is the *unbiased* (n-1) one, as
  `torch.std` in verl. `epsilon` is added to the std, so a zero-variance group gets exactly 0. A group of
  size 1 gets 0 in every group estimator here (there is no baseline); verl leaves its raw reward.
- `dr_grpo` (Liu et al., 2025): `grpo` without the std division (`grpo` with `norm_by_std=False`); pair
  it with `loss_agg=seq_mean_token_sum_norm` for the paper's constant length normalizer.
- `rloo` (Ahmadian et al., 2024): reward minus the mean of the *other* rewards of the group, which is
  n/(n-1) times the mean-centred reward.
- `reinforce_pp` (Hu, 2025, REINFORCE++ with group baseline): subtract the group mean, then whiten over
  the whole batch (unbiased variance, eps 1e-8 inside the square root, as verl's `masked_whiten`). With
  a `response_mask` each trajectory weighs by its token count, exactly like verl's token-level
  whitening; without one every trajectory weighs 1.
- `gae` (Schulman et al., 2016; `gae.py`): per-token GAE over the response mask, skipping masked positions (tool
  observations) so the TD chain jumps over them, as verl's multi-turn GAE; whitened over the batch's
  masked tokens by default. Without `token_rewards` the outcome reward sits on the last masked token.
- `arena` (ArenaRL): tournament scores (rank quantiles from `rl_factory.algorithms.arena`) z-scored
  within the group, unbiased std + 1e-6 as the reference implementation.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import torch

from rl_factory.base.errors import UserError
from rl_factory.base.registry import Registry
from rl_factory.base.types import Group

AdvantageFn = Callable[..., torch.Tensor]


class AdvantageError(UserError, ValueError):
    """An estimator gave non-finite advantages (rewards near the float range, an option such as epsilon=0)."""

ADVANTAGES: Registry[AdvantageFn] = Registry("advantage estimator")
REQUIRED_INPUTS: dict[str, tuple[str, ...]] = {}
USED_INPUTS: dict[str, tuple[str, ...]] = {}  # read when given, never missing
# The optional inputs and their dimensions ([N] per trajectory, [N, T] per token); `register_input` adds more.
INPUT_DIMS: dict[str, int] = {"token_rewards": 2, "values": 2, "response_mask": 2, "scores": 1}
TargetsFn = Callable[..., tuple[torch.Tensor, torch.Tensor]]
# name -> fn(inputs, **options) -> (advantages, critic targets): the estimators that train a critic
VALUE_TARGETS: dict[str, TargetsFn] = {}


@dataclass
class AdvantageInputs:
    """Everything any estimator may read; optional fields are None unless the estimator needs them.

    Attributes:
        rewards: [N] float64 outcome reward per trajectory.
        group_index: [N] long group number in 0..G-1.
        token_rewards: [N, T] per-token rewards (token-level estimators).
        values: [N, T] critic values (GAE).
        response_mask: [N, T] 1 on trained (generated) tokens, 0 elsewhere.
        scores: [N] precomputed per-trajectory scores, e.g. tournament rank quantiles (arena).
        extra: the inputs added with `register_input`, read as attributes (`inputs.<name>`).
    """

    rewards: torch.Tensor
    group_index: torch.Tensor
    token_rewards: torch.Tensor | None = None
    values: torch.Tensor | None = None
    response_mask: torch.Tensor | None = None
    scores: torch.Tensor | None = None
    extra: dict[str, torch.Tensor] = field(default_factory=dict)

    def __getattr__(self, name: str) -> Any:  # only for names that are not fields: the registered inputs
        if name in INPUT_DIMS:
            return self.__dict__.get("extra", {}).get(name)
        raise AttributeError(name)

    @classmethod
    def build(cls, rewards: Any, group_ids: Any, **optional: Any) -> AdvantageInputs:
        """Convert and check raw inputs (tensors, arrays or lists; group ids any hashable labels).

        Raises:
            ValueError: wrong shapes, mismatched lengths or non-finite values.
        """
        values = _as_float(rewards, "rewards", dims=1)
        group_index = _group_index(group_ids, device=values.device)
        if group_index.numel() != values.numel():
            raise ValueError(f"got {values.numel()} rewards but {group_index.numel()} group ids")
        extra = {}
        for name, value in optional.items():
            if name not in INPUT_DIMS:
                raise ValueError(f"unknown advantage input {name!r}; known: {sorted(INPUT_DIMS)}")
            if value is None:
                continue
            extra[name] = _as_float(value, name, dims=INPUT_DIMS[name]).to(values.device)
            if extra[name].shape[0] != values.numel():
                raise ValueError(f"{name} has {extra[name].shape[0]} rows for {values.numel()} rewards")
        shapes = {tuple(v.shape) for k, v in extra.items() if INPUT_DIMS[k] == 2}
        if len(shapes) > 1:
            raise ValueError(f"token-level inputs disagree in shape: {sorted(shapes)}")
        own = {f.name for f in fields(cls)}
        return cls(values, group_index, **{k: v for k, v in extra.items() if k in own},
                   extra={k: v for k, v in extra.items() if k not in own})


def register_input(name: str, dims: int) -> None:
    """Declare a new optional estimator input (its provider does, rl_factory/providers.py): [N] (`dims=1`)
    or [N, T] (`dims=2`). Estimators read it as `inputs.<name>`; declaring a known name again is a no-op."""
    if dims not in (1, 2):
        raise ValueError(f"advantage input {name!r}: dims must be 1 or 2, got {dims}")
    if name in {f.name for f in fields(AdvantageInputs)} - set(INPUT_DIMS) or INPUT_DIMS.get(name, dims) != dims:
        raise ValueError(f"advantage input {name!r} is already declared otherwise")
    INPUT_DIMS[name] = dims


def register_advantage(name: str, requires: Sequence[str] = (), uses: Sequence[str] = ()
                       ) -> Callable[[AdvantageFn], AdvantageFn]:
    """Decorator adding an estimator to `ADVANTAGES` under `name`; a taken name is an error.

    Args:
        name: registry key.
        requires: optional inputs (`INPUT_DIMS`) the estimator cannot work without.
        uses: optional inputs it reads when they are given (the trainer fills them when a provider can).
    """
    unknown = sorted((set(requires) | set(uses)) - set(INPUT_DIMS))
    if unknown:
        raise ValueError(f"advantage {name!r} requires unknown inputs {unknown}; known: {sorted(INPUT_DIMS)} "
                         "(a new input is declared with register_input, by its provider)")

    def decorator(fn: AdvantageFn) -> AdvantageFn:
        ADVANTAGES.register(name)(fn)
        REQUIRED_INPUTS[name] = tuple(requires)
        USED_INPUTS[name] = tuple(uses)
        return fn

    return decorator


def get_advantage(name: str) -> AdvantageFn:
    """The estimator registered as `name`; KeyError listing the valid names otherwise."""
    return ADVANTAGES.lookup(name)


def required_inputs(name: str) -> tuple[str, ...]:
    """The optional `AdvantageInputs` fields estimator `name` needs (KeyError for unknown names)."""
    get_advantage(name)
    return REQUIRED_INPUTS[name]


def wanted_inputs(name: str) -> tuple[str, ...]:
    """The inputs to fill for estimator `name`: what it requires, then what it uses when given."""
    get_advantage(name)
    return REQUIRED_INPUTS[name] + tuple(k for k in USED_INPUTS.get(name, ()) if k not in REQUIRED_INPUTS[name])


def estimate_with_targets(name: str, inputs: AdvantageInputs, **options: Any
                          ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(advantages, the critic's targets) for an estimator in `VALUE_TARGETS`, else (`estimate(...)`, None)."""
    if name in VALUE_TARGETS:
        return VALUE_TARGETS[name](inputs, **options)
    return estimate(name, inputs, **options), None


def estimate(name: str, inputs: AdvantageInputs, **options: Any) -> torch.Tensor:
    """Run estimator `name` on checked inputs: the single call site for every estimator.

    Returns:
        [N] (outcome estimators) or [N, T] (token-level) float32 advantages.
    """
    fn = get_advantage(name)
    missing = [k for k in REQUIRED_INPUTS[name] if getattr(inputs, k) is None]
    if missing:
        raise ValueError(f"advantage estimator {name!r} needs {missing}, which were not given")
    if inputs.rewards.numel() == 0:
        return torch.zeros(0, dtype=torch.float32, device=inputs.rewards.device)
    advantages = fn(inputs, **options).to(torch.float32)
    bad = (~torch.isfinite(advantages)).nonzero()[:, 0].unique().tolist()
    if bad:  # e.g. rewards near the float range, or epsilon=0 with a group whose rewards are all equal
        raise AdvantageError(f"advantage estimator {name!r} gave non-finite advantages for trajectories {bad[:10]} "
                         f"(rewards {inputs.rewards[bad[:3]].tolist()}, options {options})")
    return advantages


def compute_advantages(name: str, rewards: Any, group_ids: Any, *, token_rewards: Any = None,
                       values: Any = None, response_mask: Any = None, scores: Any = None,
                       **options: Any) -> torch.Tensor:
    """Advantages with the estimator registered as `name`, from plain rewards and group ids.

    Args:
        name: registry key, e.g. "grpo".
        rewards: [N] tensor, numpy array or list of floats, one per trajectory.
        group_ids: [N] group labels (ints or strings, any order; equal label = same prompt).
        token_rewards, values, response_mask: [N, T], for token-level estimators ("gae").
        scores: [N] tournament scores, for "arena".
        **options: estimator options, e.g. `norm_by_std`, `epsilon` for "grpo".

    Returns:
        [N] (or [N, T] for token-level estimators) float32 advantages, on the device of `rewards`.
    """
    inputs = AdvantageInputs.build(rewards, group_ids, token_rewards=token_rewards, values=values,
                                   response_mask=response_mask, scores=scores)
    return estimate(name, inputs, **options)


def assign_advantages(name: str, groups: Sequence[Group], rewards: Sequence[float] | None = None,
                      scores: Sequence[float] | None = None, **options: Any) -> torch.Tensor:
    """Compute outcome advantages for scored groups and store each on `trajectory.advantage`.

    Args:
        rewards: one per trajectory in group-then-trajectory order (default: each `trajectory.reward`;
            the trainer passes the outcome plus summed process rewards).
        scores: tournament scores, for "arena".

    Returns:
        [N] float32 advantages in group-then-trajectory order.
    """
    trajs = [t for g in groups for t in g.trajectories]
    if rewards is None:
        unscored = [t.sample_index for t in trajs if t.reward is None]
        if unscored:
            raise ValueError(f"trajectories of samples {sorted(set(unscored))[:10]} have no reward yet")
        rewards = [t.reward for t in trajs]
    group_ids = [gi for gi, g in enumerate(groups) for _ in g.trajectories]
    advantages = compute_advantages(name, rewards, group_ids, scores=scores, **options)
    if advantages.dim() != 1:
        raise ValueError(f"{name!r} is a token-level estimator; trajectories hold one advantage each")
    for traj, adv in zip(trajs, advantages.tolist(), strict=True):
        traj.advantage = adv
    return advantages


def _as_float(value: Any, name: str, dims: int) -> torch.Tensor:
    tensor = torch.as_tensor(value, dtype=torch.float64)
    if tensor.dim() != dims:
        raise ValueError(f"{name} must be {dims}-D, got shape {tuple(tensor.shape)}")
    bad = (~torch.isfinite(tensor)).nonzero()[:, 0].unique().tolist()
    if bad:
        what = "indices" if dims == 1 else "rows"
        raise ValueError(f"{name} at {what} {bad[:10]} are not finite")
    return tensor


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
    # The statistics of values / scale, scaled back: a sum of 1e308s or a square of 1e155 would overflow
    # (NaN or all-zero advantages); a power of two keeps every value of ordinary size bit-for-bit.
    top = float(values.abs().max()) if values.numel() else 0.0
    scale = 2.0 ** math.frexp(top)[1] if top > 1e100 else 1.0
    scaled = values / scale
    mean = torch.zeros(num_groups, dtype=values.dtype, device=values.device)
    mean = mean.index_add(0, group_index, scaled) / size  # [G]
    sq_dev = (scaled - mean[group_index]) ** 2  # [N]
    var = torch.zeros_like(mean).index_add(0, group_index, sq_dev) / (size - 1).clamp(min=1)
    return mean[group_index] * scale, var.sqrt()[group_index] * scale, size[group_index]


def group_zscore(values: torch.Tensor, group_index: torch.Tensor, norm_by_std: bool = True,
                 epsilon: float = 1e-6) -> torch.Tensor:
    """[N] values centred (and by default scaled by std + epsilon) within their group; 0 for singletons."""
    mean, std, size = group_stats(values, group_index)
    centred = values - mean
    if norm_by_std:
        centred = centred / (std + epsilon)
    return torch.where(size > 1, centred, torch.zeros_like(centred))


def whiten(values: torch.Tensor, weights: torch.Tensor, epsilon: float = 1e-8) -> torch.Tensor:
    """(x - mean) / sqrt(var + epsilon) with weighted mean and Bessel-corrected weighted variance.

    Args:
        values: any shape; weights: the same shape (a 0/1 mask, or token counts per trajectory).

    Returns:
        Whitened values, same shape (where the weight is 0 too; mask them yourself).
    """
    total = weights.sum()
    top = float(values.abs().max()) if values.numel() else 0.0
    values = values / (2.0 ** math.frexp(top)[1] if top > 1e100 else 1.0)  # the result is scale-free
    mean = (values * weights).sum() / total.clamp(min=1e-12)
    var = ((values - mean) ** 2 * weights).sum() / (total - 1).clamp(min=1e-12)
    return (values - mean) * torch.rsqrt(var + epsilon)


@register_advantage("grpo")
def compute_grpo_advantage(inputs: AdvantageInputs, norm_by_std: bool = True,
                           epsilon: float = 1e-6) -> torch.Tensor:
    """GRPO: each reward z-scored within its group.

    Args:
        inputs: rewards [N] and group_index [N].
        norm_by_std: divide by the group std (False: only subtract the group mean, i.e. Dr. GRPO).
        epsilon: added to the std to avoid division by zero.

    Returns:
        [N] advantages; 0 for groups of size 1.
    """
    return group_zscore(inputs.rewards, inputs.group_index, norm_by_std, epsilon)


@register_advantage("dr_grpo")
def compute_dr_grpo_advantage(inputs: AdvantageInputs) -> torch.Tensor:
    """Dr. GRPO: the group-mean-centred reward, no std division. [N]; 0 for groups of size 1."""
    return group_zscore(inputs.rewards, inputs.group_index, norm_by_std=False)


@register_advantage("rloo")
def compute_rloo_advantage(inputs: AdvantageInputs) -> torch.Tensor:
    """RLOO: r_i - mean_{j != i} r_j = n / (n - 1) * (r_i - mean). [N]; 0 for groups of size 1."""
    mean, _, size = group_stats(inputs.rewards, inputs.group_index)
    loo = (inputs.rewards - mean) * size / (size - 1).clamp(min=1)
    return torch.where(size > 1, loo, torch.zeros_like(loo))


@register_advantage("reinforce_pp")
def compute_reinforce_pp_advantage(inputs: AdvantageInputs, epsilon: float = 1e-8) -> torch.Tensor:
    """REINFORCE++ with group baseline: group-mean-centred rewards whitened over the whole batch.

    Args:
        inputs: rewards [N], group_index [N]; an optional response_mask [N, T] weighs each
            trajectory by its token count (verl's token-level whitening).
        epsilon: added to the variance.

    Returns:
        [N] advantages.
    """
    centred = group_zscore(inputs.rewards, inputs.group_index, norm_by_std=False)
    mask = inputs.response_mask
    weights = torch.ones_like(centred) if mask is None else mask.sum(-1).to(centred.dtype)
    return whiten(centred, weights, epsilon)


@register_advantage("arena", requires=("scores",))
def compute_arena_advantage(inputs: AdvantageInputs, epsilon: float = 1e-6) -> torch.Tensor:
    """ArenaRL: tournament scores (rank quantiles) z-scored within the group. [N]; ties share a value."""
    return group_zscore(inputs.scores, inputs.group_index, norm_by_std=True, epsilon=epsilon)
