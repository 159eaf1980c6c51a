"""The rollout stage of an embedded training step: rounds of generation, filters, dynamic sampling.

    batch = await pipeline.collect(step)   # rounds until enough groups survive the filters
    await pipeline.augment(batch)          # training views of every kept trajectory

One round draws prompts from the `PromptSampler`, rolls out n trajectories per prompt (scored as each
finishes), runs the filters, computes what the estimator normalizes (outcome rewards, or the group
stage's scores: for `arena` the tournament, played among the survivors only) and runs the scored
filters (`zero_variance`) on it.
Without `rollout.dynamic_sampling.min_groups` there is one round of `data.train_batch_size` prompts.
With it, rounds go on until `min_groups` groups survive or `max_rounds` rounds were drawn (then the
step trains on what survived, logs `rollout/max_rounds_hit` and warns). Round k > 1 draws
ceil(missing / survival rate so far) prompts, at least the missing count and at most
max(train_batch_size, missing): all prompts, even a whole first round's, if none survived yet. Every
survivor trains (DAPO trims to exactly the batch size; the extra groups are already paid for).

Reproducible on resume: prompts come from the run's one `PromptSampler`, whose position (advanced
by every round) is saved in each checkpoint, so a resumed run draws the prompts the killed one would.

Metrics across rounds: counts and seconds add up; keys ending in "/mean" or "_spearman" are averaged,
weighted by each round's trajectory count.
"""
from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field, replace
from collections.abc import Coroutine
from typing import Any

from rl_factory import capabilities
from rl_factory.capabilities import pipeline_facts
from rl_factory.config import ConfigError
from rl_factory.data import PromptSampler
from rl_factory.engines.base import SamplingParams, derive_seed
from rl_factory.pipeline.augment import augment, build_augmenters
from rl_factory.pipeline.filters import apply_filters, build_filters
from rl_factory.rollout import Agent
from envs.episode import EpisodeError
from rl_factory.base.types import EPISODE_FAILED, Group, Trajectory
from rewards.scorer import Scorer

log = logging.getLogger("rl_factory")


@dataclass
class DynamicSamplingConfig:
    """`rollout.dynamic_sampling.*`: draw more prompts until enough groups survive the filters."""

    # groups that must survive the filters; None = off (one round of data.train_batch_size prompts)
    min_groups: int | None = None
    # rounds of drawing at most; the step then trains on what survived
    max_rounds: int = 4


@dataclass
class PipelineConfig:
    """The rollout pipeline's keys of `rollout.*`."""

    filters: list[Any] = field(default_factory=list)
    dynamic_sampling: DynamicSamplingConfig = field(default_factory=DynamicSamplingConfig)
    augment: list[Any] = field(default_factory=list)


@dataclass
class Batch:
    """What one step trains on, and everything it generated to get there.

    Attributes:
        groups: the groups with a survivor, holding only their survivors, in the order drawn.
        trajectories: every trajectory of every round, dropped ones included (`dropped_by` set).
        scores: [kept trajectories] tournament scores for `arena`, in group-then-trajectory order; else None.
        metrics: rewards, filter/*, rollout/*, timing/* and arena/* of the step.
    """

    groups: list[Group]
    trajectories: list[Trajectory]
    scores: list[float] | None
    metrics: dict[str, float]

    @property
    def kept(self) -> list[Trajectory]:
        return [t for g in self.groups for t in g.trajectories]


def check_pipeline(cfg: PipelineConfig, advantage: str, context: str, backend: str = "embedded") -> None:
    """Refuse up front what the estimator or context policy cannot train with (ConfigError; the combinations
    from the capability table, rl_factory/capabilities.py)."""
    facts = pipeline_facts(context, cfg.filters, cfg.augment)
    capabilities.check(backend, {**facts, "algorithm.advantage": advantage})
    ds = cfg.dynamic_sampling
    if ds.min_groups is not None and ds.min_groups < 1:
        raise ConfigError(f"rollout.dynamic_sampling.min_groups must be >= 1 or null, got {ds.min_groups}")
    if ds.max_rounds < 1:
        raise ConfigError(f"rollout.dynamic_sampling.max_rounds must be >= 1, got {ds.max_rounds}")


class RolloutPipeline:
    """Generation -> filters -> (dynamic sampling) -> augmentation for the embedded trainer.

    Args:
        cfg: the pipeline's `rollout.*` keys.
        agent: rolls out trajectories (its env also backs the reward's `tools`).
        rows, sampler: the training rows and the run's prompt sampler.
        batch_size: prompts of the first round (`data.train_batch_size`).
        group_size: trajectories per prompt (`rollout.n`).
        params: sampling parameters of training rollouts.
        scorer: the run's one reward path (rewards.scorer): outcome and per-turn process rewards, scored as
            each trajectory finishes; its `outcome` is what the estimator sees.
        group_stage: what scores each round's surviving groups for the estimator instead of the outcome
            rewards (the tournament of `scores`, rl_factory/providers.py), else None:
            `await group_stage(groups, step, extra_rollouts) -> (scores, metrics)`, where `extra_rollouts(groups)`
            samples one more rollout per group's prompt with `anchor_params` (a greedy anchor).
        seed: the run's seed; round r of step s samples with a seed derived from (seed, s, r), so a
            prompt drawn again in a later round does not repeat its rollouts.
    """

    def __init__(self, cfg: PipelineConfig, *, agent: Agent, rows: list[dict], sampler: PromptSampler,
                 batch_size: int, group_size: int, params: SamplingParams, scorer: Scorer,
                 group_stage: Any = None, anchor_params: SamplingParams | None = None,
                 seed: int | None = None):
        self.cfg, self.agent, self.rows, self.sampler = cfg, agent, rows, sampler
        self.batch_size, self.group_size, self.params = batch_size, group_size, params
        self.scorer = scorer
        self.group_stage, self.anchor_params = group_stage, anchor_params
        self.seed = seed  # each round's sampling seed derives from it (same seed, same run)
        self.filters = build_filters(cfg.filters)
        self.augmenters = build_augmenters(cfg.augment)

    async def collect(self, step: int) -> Batch:
        """Rounds of rollouts until enough groups survive the filters (see the module docstring)."""
        return await self.start(step)

    @property
    def one_draw(self) -> bool:
        """A batch draws its prompts once, when it starts (no dynamic sampling: no later rounds)."""
        return self.cfg.dynamic_sampling.min_groups is None

    def start(self, step: int) -> Coroutine[Any, Any, Batch]:
        """Draw step `step`'s first round of prompts now; the returned coroutine rolls them out (and draws
        any further rounds when they are due). With `one_draw`, batches started one after another hold the
        sampler's prompts in step order whatever order they finish in (the async trainer runs them at once)."""
        first = self.sampler.next_indices(self.batch_size)
        return self._collect(step, first)

    async def _collect(self, step: int, first: list[int]) -> Batch:
        target, max_rounds = self.cfg.dynamic_sampling.min_groups, self.cfg.dynamic_sampling.max_rounds
        groups: list[Group] = []
        scores: list[float] = []
        trajs: list[Trajectory] = []
        dropped = {f.name: 0 for f in self.filters}
        rounds: list[tuple[int, dict[str, float]]] = []
        drawn = 0
        while True:
            indices = first if not rounds else self.sampler.next_indices(self._round_size(target, len(groups), drawn))
            drawn += len(indices)
            generated, metrics = await self._generate(indices, derive_seed(self.seed, step, len(rounds)), step)
            trajs += [t for g in generated for t in g.trajectories]
            kept, values, more = await self._filter(generated, step, dropped)
            groups += kept
            scores += values
            rounds.append((sum(len(g.trajectories) for g in generated), {**metrics, **more}))
            if target is None or len(groups) >= target or len(rounds) >= max_rounds:
                break
        metrics = merge_rounds(rounds)
        metrics.update({f"filter/{name}/dropped": float(n) for name, n in dropped.items()})
        kept_trajs = sum(len(g.trajectories) for g in groups)
        if dropped:
            metrics["filter/kept_fraction"] = kept_trajs / len(trajs)
        metrics.update({"rollout/prompts": float(drawn), "rollout/groups": float(len(groups)),
                        "rollout/rounds": float(len(rounds)),
                        "rollout/generated_tokens": float(sum(t.num_generated_tokens for t in trajs))})
        if target is not None:
            metrics["rollout/max_rounds_hit"] = float(len(groups) < target)
            if len(groups) < target:
                log.warning("step %d: dynamic sampling drew %d prompts in %d rounds (max_rounds) and kept %d of the "
                            "%d groups asked for; training on those", step, drawn, len(rounds), len(groups), target)
        return Batch(groups, trajs, scores if self.group_stage is not None else None, metrics)

    async def augment(self, batch: Batch) -> dict[str, float]:
        """Replace the kept trajectories' training samples by the augmenters' views (none: no change)."""
        return await augment(self.augmenters, batch.kept)

    def _round_size(self, target: int | None, kept: int, drawn: int) -> int:
        if not drawn or target is None:
            return self.batch_size
        missing = target - kept
        if kept == 0:
            return max(self.batch_size, missing)
        return min(max(self.batch_size, missing), max(missing, math.ceil(missing * drawn / kept)))

    async def _generate(self, indices: list[int], seed: int | None, step: int) -> tuple[list[Group], dict[str, float]]:
        """Roll out `group_size` trajectories for each drawn prompt and score them (as each finishes). The
        engine admits an older step's turns first (the async trainer's batches overlap)."""
        t0 = time.perf_counter()
        samples = [self.rows[i] for i in indices]
        # Each trajectory is scored in its own episode, as it finishes (a reward's `tools` reach its servers).
        params = replace(self.params, seed=seed, priority=step)
        groups = await self.agent.rollout_groups(samples, indices, self.group_size, params, scorer=self.scorer)
        trajs = [t for g in groups for t in g.trajectories]
        failed = [t for t in trajs if t.dropped_by == EPISODE_FAILED]
        if failed and len(failed) == len(trajs):  # nothing to train on: a setup error, not one bad sample
            raise EpisodeError(f"every episode of this round failed; the first: sample {failed[0].sample_index}: "
                               f"{failed[0].reward_info.get('episode_error')}")
        t1 = time.perf_counter()
        metrics = await self.scorer.wait(trajs)  # reports reward failures in order, and the batch's metrics
        if failed:
            metrics["episode/dropped"] = float(len(failed))
        return groups, {**metrics, "timing/rollout_s": t1 - t0, "timing/reward_s": time.perf_counter() - t1}

    async def _filter(self, groups: list[Group], step: int, dropped: dict[str, int]
                      ) -> tuple[list[Group], list[float], dict[str, float]]:
        """The survivors of every filter, their estimator inputs, and the group stage's metrics (arena's)."""
        # A trajectory whose episode failed never ran: it leaves its group before any filter, like a
        # dropped one (the group's statistics are its survivors').
        groups = [Group(g.sample_index, kept) for g in groups
                  if (kept := [t for t in g.trajectories if t.dropped_by != EPISODE_FAILED])]
        return await apply_filters(self.filters, groups,
                                   lambda kept: self._estimator_inputs(kept, step), dropped)

    async def _estimator_inputs(self, groups: list[Group], step: int) -> tuple[list[float], dict[str, float]]:
        """Per kept trajectory: the outcome reward the estimator sees, or the group stage's score (arena's)."""
        if self.group_stage is None:
            return [self.scorer.outcome(t) for g in groups for t in g.trajectories], {}
        return await self.group_stage(groups, step, self._extra_rollouts)

    async def _extra_rollouts(self, groups: list[Group]) -> list[Group]:
        """One more rollout per group's prompt with `anchor_params` (greedy by default)."""
        samples = [g.trajectories[0].sample for g in groups]
        return await self.agent.rollout_groups(samples, [g.sample_index for g in groups], 1, self.anchor_params)


def merge_rounds(rounds: list[tuple[int, dict[str, float]]]) -> dict[str, float]:
    """One dict from each round's metrics: sums, except "/mean" and "_spearman" keys (weighted means)."""
    if len(rounds) == 1:
        return dict(rounds[0][1])
    sums: dict[str, float] = {}
    weights: dict[str, float] = {}
    for n, metrics in rounds:
        for key, value in metrics.items():
            mean = key.endswith("/mean") or key.endswith("_spearman")
            sums[key] = sums.get(key, 0.0) + (value * n if mean else value)
            weights[key] = weights.get(key, 0.0) + n
    return {k: (v / weights[k] if (k.endswith("/mean") or k.endswith("_spearman")) and weights[k] else v)
            for k, v in sums.items()}
