"""The rollout pipeline on verl: our filters and augmenters in the agent loop, verl's DAPO refill.

Stage by stage, what runs where (verl 0.9.1, V1 trainer):
- filters (`rollout.filters`): ours, where a prompt's n sessions meet in their AgentLoopWorker (the
  rendezvous of ArenaRL, `group.py`). The last session to finish scores every trajectory with the
  reward verl's reward worker would call (`reward.compute_score`, so the numbers are the same), runs the
  filters as the embedded trainer does (`rl_factory.pipeline.filters.apply_filters`; for `arena` the
  tournament among the survivors), and every session returns its score as verl's `reward_score` (verl
  then skips its reward worker for it). verl has no per-trajectory filter of its own.
- a dropped trajectory: its outputs keep their tokens but get response_mask 0 (no token trains) and
  `rl_factory_dropped` in extra_fields. Our estimators in verl (`plugin.py`) leave rows without a
  trained token out of the group statistics, so, as in the embedded trainer, the group is its
  survivors; with filters, `grpo` and `rloo` therefore run as our registered copies (`rl_factory_grpo`,
  `rl_factory_rloo`, equal to verl's otherwise). verl's `gae` already whitens over trained tokens only.
- dynamic sampling (`rollout.dynamic_sampling`): verl's own, the V1 ReplayBuffer's DAPO group filter
  (a finished group whose metric is constant is evicted, two prompts are drawn per evicted group from
  verl's checkpointed dataloader, surplus groups are discarded), plugged in through its custom-sampler
  hook as `RolloutReplayBuffer`. Its metric is our `rl_factory_group_key`: 0 on every trajectory of a
  group the filters dropped entirely, the session index otherwise, so verl evicts exactly those
  groups. It adds `max_rounds`, which verl's V1 buffer does not enforce (it ignores
  `max_num_gen_batches`): once (max_rounds - 1) x train_batch_size prompts were refilled for a step,
  nothing more is evicted and the step trains on what finished (`rollout/max_rounds_hit`, a warning).
  verl's batch always holds `data.train_batch_size` groups, so `min_groups` must equal it.
- augmenters (`rollout.augment`): ours, in the agent loop: each view is one `AgentLoopOutput` of the
  session, like the step context, and verl's `grpo` gives every output of a session the session's
  advantage. verl has no per-sample weight, so every view must weigh 1.
"""
from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
from collections import Counter
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from rewards.combine import RewardConfig
from rl_factory import capabilities
from rl_factory.algorithms.advantages import REQUIRED_INPUTS
from rl_factory.backends.verl import supported
from rl_factory.backends.verl.group import ArenaGroups, _Pending
from rl_factory.backends.verl.plugin import registered_name, verl_fills
from rl_factory.backends.verl.records import RECORD_KEY, to_record
from rl_factory.backends.verl.reward import compute_score
from rl_factory.backends.verl.sampler import POLL_INTERVAL_S, PollingReplayBuffer
from rl_factory.config import RunConfig, plain
from rl_factory.pipeline import augment, build_filters, check_pipeline
from rl_factory.pipeline.filters import Filter, apply_filters
from rl_factory.base.types import Group, Trajectory

log = logging.getLogger("rl_factory.verl")

DROPPED_KEY = "rl_factory_dropped"
GROUP_KEY = "rl_factory_group_key"
SAMPLER_NAME = "RolloutReplayBuffer"


def check_verl_pipeline(ours: RunConfig, cfg: DictConfig) -> None:
    """Refuse up front what verl cannot train (module docstring; the capability table, supported.py) and a
    malformed pipeline; `cfg` is the composed config."""
    check_pipeline(ours.rollout, ours.algorithm.advantage, ours.rollout.context, backend="verl")
    supported.check(ours, cfg)


def pipeline_values(ours: RunConfig) -> dict[str, Any]:
    """verl key -> value for the pipeline (an addition to `config.verl_values`' table)."""
    roll, values = ours.rollout, {}
    # Ours leave dropped rows (a filter's, a failed episode's) out of the group; verl's own grpo is kept
    # where a session has several outputs (it alone broadcasts their advantage).
    multi_output = roll.augment or roll.context == "step"
    drops = roll.filters or (episodic(ours) and not multi_output)
    advantage = ours.algorithm.advantage
    if drops and registered_name(advantage) != advantage and verl_fills(advantage):  # ours under verl's name
        values["algorithm.adv_estimator"] = registered_name(advantage)
    if roll.dynamic_sampling.min_groups is not None:
        values.update({
            "trainer.v1.sampler.custom_sampler.path": _sampler_path(),
            "trainer.v1.sampler.custom_sampler.name": SAMPLER_NAME,
            "trainer.v1.sampler.sampler_kwargs.rl_factory": {
                "train_batch_size": ours.data.train_batch_size,
                "max_rounds": roll.dynamic_sampling.max_rounds, "poll_interval_s": POLL_INTERVAL_S,
                "max_inflight_gen_batches": "${algorithm.filter_groups.max_inflight_gen_batches}"},
        })
    return values


def episodic(ours: RunConfig) -> bool:
    """Whether the run's episodes hold state (`scope: episode` servers or an environment): read from the
    config in the driver, starting nothing. The manifest is read as plain YAML, not loaded: loading it
    interpolates `${oc.env:VAR}` and registers the values as literal secrets, which would mask them in
    the config handed to verl's workers."""
    import yaml

    if ours.env.environment:
        return True
    tools = ours.env.tools
    try:
        raw = yaml.safe_load(Path(tools).read_text()) if isinstance(tools, str) and tools else tools
    except (OSError, yaml.YAMLError):  # the launcher reports a bad manifest on its own
        return False
    servers = raw.get("mcpServers") if isinstance(raw, dict) else None
    return any(isinstance(s, dict) and s.get("scope") == "episode" and not s.get("disabled")
               for s in (servers or {}).values())


def _sampler_path() -> str:
    return supported.OUR_SAMPLER_PATH


class PipelineGroups(ArenaGroups):
    """The n sessions of a prompt meet; the last scores them all and runs the filters (module docstring)."""

    def __init__(self, filters: list[Filter], reward_settings: dict[str, Any], arena: Any, tools: Any,
                 out_dir: Path):
        super().__init__(arena, None, tools, out_dir)
        self.filters, self.reward_settings = filters, reward_settings

    @classmethod
    def from_config(cls, ours: RunConfig, tools: Any, out_dir: Path) -> PipelineGroups:
        arena = ArenaGroups.from_config(ours, tools, out_dir).arena if tournament(ours) else None
        out_dir.mkdir(parents=True, exist_ok=True)
        settings = {"reward": reward_settings(ours.reward), "tools": ours.env.tools}  # as verl's reward_kwargs
        return cls(build_filters(ours.rollout.filters), settings, arena, tools, out_dir)

    async def _play(self, uid: str, entry: _Pending, step: int) -> dict[int, float]:
        sessions = sorted(s for s, t in entry.trajs.items() if t is not None)
        trajs = [entry.trajs[s] for s in sessions]
        if not trajs:
            return {}
        await asyncio.gather(*(self._score(t) for t in trajs))
        dropped = {f.name: 0 for f in self.filters}
        kept, values, metrics = await apply_filters(self.filters, [Group(trajs[0].sample_index, trajs)],
                                                    lambda groups: self._estimator_inputs(groups, step, uid), dropped)
        survivors = {id(t): v for g in kept for t, v in zip(g.trajectories, values)}
        for s, t in zip(sessions, trajs):
            t.reward_info[GROUP_KEY] = float(s) if kept else 0.0
        with (self.out_dir / "metrics.jsonl").open("a") as f:
            f.write(json.dumps({"step": step, "uid": uid, **{f"filter/{k}/dropped": v for k, v in dropped.items()},
                                **metrics}) + "\n")
        # arena: the survivors' tournament scores; a dropped trajectory keeps its reward (it trains nothing)
        return {s: survivors.get(id(t), t.reward) if self.arena is not None else t.reward
                for s, t in zip(sessions, trajs)}

    async def _score(self, traj: Trajectory) -> None:
        """What verl's reward worker would compute: our compute_score on the trajectory's record (unless the
        agent loop scored it already, inside its episode)."""
        if traj.reward is not None:
            return
        result = await compute_score(extra_info={RECORD_KEY: to_record(traj)}, rl_factory=self.reward_settings)
        traj.reward, traj.reward_info = float(result["score"]), dict(result)  # = verl's reward_extra_info

    async def _estimator_inputs(self, groups: list[Group], step: int, uid: str
                                ) -> tuple[list[float], dict[str, float]]:
        if self.arena is None or not groups:
            return [t.reward for g in groups for t in g.trajectories], {}
        if len(groups[0].trajectories) == 1:
            return [0.0], {}  # nobody to play; a group of one gets no advantage anyway
        return await self.arena.score_groups(groups, step, group_ids=[uid])


def reward_settings(reward: RewardConfig) -> dict[str, Any]:
    """`reward.*` as plain data, for `compute_score`'s reward_kwargs (it parses them as the reward worker does)."""
    return dataclasses.asdict(reward)


def tournament(ours: RunConfig) -> bool:
    """Whether the estimator ranks a prompt's rollouts by tournament: it declares `requires=("scores",)`
    (rl_factory/algorithms/advantages.py; `arena`)."""
    return "scores" in REQUIRED_INPUTS.get(ours.algorithm.advantage, ())


def group_stage(ours: RunConfig, tools: Any, output_dir: Path, worker: str) -> ArenaGroups | None:
    """The per-prompt rendezvous of an agent-loop worker: filters (and arena), arena alone, or none."""
    if ours.rollout.filters:
        where = "arena" if tournament(ours) else "pipeline"
        return PipelineGroups.from_config(ours, tools, output_dir / where / worker)
    if tournament(ours):
        return ArenaGroups.from_config(ours, tools, output_dir / "arena" / worker)
    return None


async def augmented(traj: Trajectory, augmenters: list, validate: bool) -> Trajectory:
    """`traj` with the augmenters' views as its steps (training rollouts only; each view one output);
    `augmenters`: the worker's, built once from `rollout.augment` (agent_loop.WorkerState)."""
    if validate or not augmenters:
        return traj
    await augment(augmenters, [traj])
    heavy = sorted({s.weight for s in traj.steps if s.weight != 1.0})
    if heavy:  # a user augmenter's weights: known only now
        names = tuple(a.name for a in augmenters)
        try:
            capabilities.check("verl", {"rollout.augment": names, capabilities.VIEW_WEIGHT: heavy[0]})
        except capabilities.Unsupported as exc:
            raise ValueError(f"sample {traj.sample_index}: {exc}") from None
    return traj


def finish_outputs(outputs: Any, traj: Trajectory, scored: bool = False) -> Any:
    """verl's outputs of `traj` after the group stage: a dropped trajectory (a filter's, or a failed episode)
    trains no token; scored in the agent loop (`scored`, or the group stage's key): the scores' extras."""
    outs = outputs if isinstance(outputs, list) else [outputs]
    if traj.dropped_by is not None:
        for out in outs:
            out.response_mask = [0] * len(out.response_mask)
            out.extra_fields[DROPPED_KEY] = traj.dropped_by
    if scored or GROUP_KEY in traj.reward_info:  # what verl's reward worker would have returned (numbers)
        outs[-1].extra_fields["reward_extra_info"] = {k: v for k, v in traj.reward_info.items()
                                                      if isinstance(v, (int, float)) and not isinstance(v, bool)}
    return outputs


class RolloutReplayBuffer(PollingReplayBuffer):
    """verl's sync V1 ReplayBuffer with DAPO group filtering on `GROUP_KEY`, capped at `max_rounds`
    (polling as `sampler.PollingReplayBuffer`).

    verl builds it from `trainer.v1.sampler.custom_sampler` with the usual arguments; our settings come in
    `sampler_kwargs.rl_factory` (train_batch_size, max_rounds, max_inflight_gen_batches).
    """

    def __init__(self, *args: Any, sampler_kwargs: Any, refill_fn: Any = None, **kwargs: Any):
        ours = plain(sampler_kwargs["rl_factory"])  # the sampler's own settings (pipeline_values), not our config
        self.round_size, self.max_rounds = int(ours["train_batch_size"]), int(ours["max_rounds"])
        self.refilled, self.capped = 0, False

        def refill(num_prompts: int) -> Any:  # counts what this step drew beyond its first round
            self.refilled += num_prompts
            return refill_fn(num_prompts)

        super().__init__(*args, sampler_kwargs=sampler_kwargs, refill_fn=refill, filter_groups_metric=GROUP_KEY,
                         train_batch_size=self.round_size, gen_batch_size=1,
                         max_inflight_gen_batches=int(ours.get("max_inflight_gen_batches") or 1), **kwargs)

    def sample(self, global_steps: int, partition_id: str, batch_size: int):
        if partition_id == "val":
            return super().sample(global_steps, partition_id, batch_size)
        self.refilled, self.capped = 0, False
        batch, metrics = super().sample(global_steps, partition_id, batch_size)
        metrics = {**metrics, "rollout/refilled_prompts": float(self.refilled),
                   "rollout/max_rounds_hit": float(self.capped)}
        if self.capped:
            log.warning("step %d: dynamic sampling refilled %d prompts (max_rounds=%d) and trains on groups the "
                        "filters dropped", global_steps, self.refilled, self.max_rounds)
        return batch, metrics

    def _dapo_filtered_keys(self, partition_id: str) -> tuple[set[str], Counter]:
        uids, counts = super()._dapo_filtered_keys(partition_id)
        if partition_id != "val" and uids and self.refilled >= (self.max_rounds - 1) * self.round_size:
            self.capped = True  # no more rounds: what finished is what the step trains on
            return set(), Counter()
        return uids, counts
