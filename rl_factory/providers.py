"""Providers: what fills each estimator input in the embedded trainer, looked up from what the estimator declares.

An estimator names its inputs when it registers (`requires` / `uses`, rl_factory/algorithms/advantages.py);
`PROVIDERS` maps each input to the stage that produces it, so the trainer never asks which estimator runs:

| input | provider | set up | each step |
|---|---|---|---|
| `scores` | `Tournament` | builds the judge (`algorithm.arena`); rankings.csv | the group tournaments, inside the pipeline |
| `values` | `Critic` (rl_factory/critic.py) | the value head on the policy | values of every token; the value loss |
| `response_mask` | `ResponseMask` | | the loss masks, [N, T] |
| `token_rewards` | `TokenRewards` | | each turn's process reward and the outcome, [N, T] |

A provider is a class taking `ProviderContext` (the run's `algorithm` slice, its scorer and optimizer
slice); it is built before any server or model starts, so a bad setting fails first. Its hooks, all
optional (`Provider` has the no-op defaults): `attach(policy)` once the policy is loaded, `param_groups()`
for the optimizer, `load(checkpoint)` / `checkpoint_files()` for resume, `start(run_dir, resume_step)`
once the run directory is written, `group_stage` (an async stage run inside the rollout pipeline, on each
round's survivors, before the scored filters), `fill(batch)` (the input's value for the step's kept
trajectories, group by group), `after(...)` (once the advantages are in: e.g. the critic's targets) and
`loss_terms()` (extra terms of the update's loss, rl_factory/update.py).

A new input is one provider: `@register_provider("name", dims=1)` declares the input (`register_input`)
and registers the class; an estimator with `requires=("name",)` then trains with no other change.
"""
from __future__ import annotations

import contextlib
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from rl_factory.algorithms.advantages import (AdvantageInputs, estimate_with_targets, register_input,
                                              required_inputs, wanted_inputs)
from rl_factory.config import ConfigError
from rl_factory.base.registry import Registry
from rl_factory.base.types import Group, Trajectory

GroupStage = Callable[..., Awaitable[tuple[list[float], dict[str, float]]]]


@dataclass
class ProviderContext:
    """What a provider is built from: the `algorithm` slice, the run's reward scorer and the `optim` slice."""

    alg: Any
    scorer: Any = None
    optim: Any = None


@dataclass
class StepBatch:
    """One step's kept trajectories (group by group) and what the rollout pipeline computed for them."""

    groups: list[Group]
    trajs: list[Trajectory]
    scores: list[float] | None = None

    @property
    def width(self) -> int:
        return max(len(t.token_ids) for t in self.trajs)

    def pad(self, rows: Sequence[Sequence[float]]) -> torch.Tensor:
        """[N, T] float64 rows aligned with each trajectory's token_ids, zero-padded to the longest."""
        width = self.width
        return torch.tensor([list(r) + [0.0] * (width - len(r)) for r in rows], dtype=torch.float64)


class Provider:
    """No-op defaults for every hook (module docstring); a provider overrides what it needs."""

    group_stage: GroupStage | None = None

    def __init__(self, ctx: ProviderContext):
        self.ctx = ctx

    async def __aenter__(self) -> Provider:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        return None

    def attach(self, policy: Any) -> None:
        return None

    def param_groups(self) -> list[dict[str, Any]]:
        return []

    def load(self, checkpoint: Path) -> None:
        return None

    def checkpoint_files(self) -> dict[str, Any]:
        return {}

    def start(self, run_dir: Path, resume_step: int = 0) -> None:
        return None

    def fill(self, batch: StepBatch) -> Any:
        raise NotImplementedError

    def after(self, batch: StepBatch, inputs: AdvantageInputs, advantages: torch.Tensor,
              targets: torch.Tensor | None) -> dict[str, float]:
        return {}

    def loss_terms(self) -> list[Any]:
        return []


PROVIDERS: Registry[type[Provider]] = Registry("advantage input provider")


def register_provider(name: str, dims: int | None = None) -> Callable[[type[Provider]], type[Provider]]:
    """Decorator registering the provider of estimator input `name`; `dims` (1: [N], 2: [N, T]) declares a
    new input too (`register_input`)."""
    if dims is not None:
        register_input(name, dims)

    def decorator(cls: type[Provider]) -> type[Provider]:
        return PROVIDERS.register(name)(cls)
    return decorator


class Providers:
    """The providers of one run's estimator, in the order it declares its inputs; an async context manager."""

    def __init__(self, advantage: str, providers: dict[str, Provider], scorer: Any = None):
        self.advantage, self.by_input, self.scorer = advantage, providers, scorer
        self._stack = contextlib.AsyncExitStack()

    @property
    def all(self) -> list[Provider]:
        return list(self.by_input.values())

    @property
    def group_stage(self) -> GroupStage | None:
        """The one stage that scores groups inside the rollout pipeline (the tournament), if any."""
        stages = [p.group_stage for p in self.all if p.group_stage is not None]
        return stages[0] if stages else None

    async def __aenter__(self) -> Providers:
        for provider in self.all:
            await self._stack.enter_async_context(provider)
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self._stack.__aexit__(*exc)

    def attach(self, policy: Any) -> None:
        for provider in self.all:
            provider.attach(policy)

    def param_groups(self) -> list[dict[str, Any]]:
        return [group for p in self.all for group in p.param_groups()]

    def load(self, checkpoint: Path) -> None:
        for provider in self.all:
            provider.load(checkpoint)

    def checkpoint_files(self) -> dict[str, Any] | None:
        files = {name: obj for p in self.all for name, obj in p.checkpoint_files().items()}
        return files or None

    def start(self, run_dir: Path, resume_step: int = 0) -> None:
        for provider in self.all:
            provider.start(run_dir, resume_step)

    def loss_terms(self) -> list[Any]:
        return [term for p in self.all for term in p.loss_terms()]

    def assign(self, groups: list[Group], scores: list[float] | None, options: dict[str, Any]) -> dict[str, float]:
        """Fill the estimator's inputs for the kept trajectories of `groups` (`scores`: the pipeline's group
        stage's, in the same order), run it and store its advantages on them (`advantage`; token-level
        estimators `token_advantages` too); returns the providers' metrics."""
        step = StepBatch(groups, [t for g in groups for t in g.trajectories], scores)
        if not step.trajs:  # the rollout filters may leave none
            return {}
        filled = {name: p.fill(step) for name, p in self.by_input.items()}
        # what an outcome estimator sees: the scorer's outcome plus summed process rewards (without a scorer: the reward)
        rewards = [self.scorer.outcome(t) if self.scorer is not None else float(t.reward or 0.0) for t in step.trajs]
        group_ids = [gi for gi, g in enumerate(step.groups) for _ in g.trajectories]
        inputs = AdvantageInputs.build(rewards, group_ids, **filled)
        advantages, targets = estimate_with_targets(self.advantage, inputs, **options)
        store(step.trajs, advantages, inputs.response_mask)
        metrics: dict[str, float] = {}
        for provider in self.all:
            metrics.update(provider.after(step, inputs, advantages, targets))
        return metrics


def build_providers(ctx: ProviderContext) -> Providers:
    """One provider per input the estimator `ctx.alg.advantage` declares (`requires`, then `uses` where a
    provider exists). Raises ConfigError for a required input no provider fills, or a provider's bad setting."""
    register_builtins()
    name = ctx.alg.advantage
    required = required_inputs(name)
    missing = [k for k in required if k not in PROVIDERS]
    if missing:
        raise ConfigError(f"algorithm.advantage: {name!r} requires {missing}, which no provider fills "
                          f"(providers: {sorted(PROVIDERS)}; rl_factory/providers.py)")
    return Providers(name, {k: PROVIDERS[k](ctx) for k in wanted_inputs(name) if k in PROVIDERS}, ctx.scorer)


def store(trajs: list[Trajectory], advantages: torch.Tensor, mask: torch.Tensor | None) -> None:
    """Advantages onto the trajectories: [N] as `advantage`; [N, T] as `token_advantages` (aligned with
    token_ids) and `advantage` their mean over the trajectory's masked tokens (logs and rollout records)."""
    if advantages.dim() == 1:
        for traj, adv in zip(trajs, advantages.tolist(), strict=True):
            traj.advantage = adv
        return
    if mask is None:
        raise ValueError("a token-level estimator's advantages need the response_mask input (requires=)")
    for i, t in enumerate(trajs):
        t.token_advantages = advantages[i, :len(t.token_ids)].tolist()
        t.advantage = float(advantages[i].sum() / mask[i].sum().clamp(min=1))


# ---- the built-in providers ----------------------------------------------------------------------------

@register_provider("scores")
class Tournament(Provider):
    """`scores`: each group's survivors play a tournament (`algorithm.arena`, rl_factory/group_arena.py)
    inside the rollout pipeline, before the scored filters; the rank quantiles are the scores."""

    def __init__(self, ctx: ProviderContext):
        super().__init__(ctx)
        from rl_factory.group_arena import GroupArena

        try:
            self.arena = GroupArena(ctx.alg.arena, ctx.scorer)
        except (KeyError, ValueError) as exc:
            raise ConfigError(f"algorithm.arena: {exc.args[0]}") from None
        self.group_stage = self.play

    async def __aenter__(self) -> Tournament:
        await self.arena.__aenter__()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.arena.__aexit__(*exc)

    def start(self, run_dir: Path, resume_step: int = 0) -> None:
        self.arena.start(run_dir, resume_step=resume_step)  # rankings.csv, matches.csv

    async def play(self, groups: list[Group], step: int, extra_rollouts: Callable[..., Awaitable[list[Group]]]
                   ) -> tuple[list[float], dict[str, float]]:
        """[kept trajectories] tournament scores and the arena/* metrics; `extra_rollouts(groups)` samples one
        greedy rollout per group's prompt (the greedy anchor)."""
        if not groups:
            return [], {}
        t0 = time.perf_counter()
        anchors = await extra_rollouts(groups) if self.arena.needs_greedy_anchor else None
        scores, metrics = await self.arena.score_groups(groups, step, anchors)
        return scores, {**metrics, "timing/arena_s": time.perf_counter() - t0}

    def fill(self, batch: StepBatch) -> list[float] | None:
        return batch.scores


@register_provider("response_mask")
class ResponseMask(Provider):
    """`response_mask`: 1 on the tokens the policy generated (the loss mask), [N, T]."""

    def fill(self, batch: StepBatch) -> torch.Tensor:
        return batch.pad([[float(m) for m in t.loss_mask] for t in batch.trajs])


@register_provider("token_rewards")
class TokenRewards(Provider):
    """`token_rewards`: each turn's process reward on its last generated token, plus the outcome reward on
    the trajectory's last generated token, [N, T]."""

    def fill(self, batch: StepBatch) -> torch.Tensor:
        from rl_factory.critic import token_rewards

        return batch.pad([token_rewards(t) for t in batch.trajs])


def register_builtins() -> None:
    """The built-in providers that live with what they provide: `values` with the critic's value head.
    Imported when first needed, not here: rl_factory.critic builds on this module."""
    import rl_factory.critic  # noqa: F401  (registers `values`)
