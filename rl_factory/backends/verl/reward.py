"""Our reward as verl's `reward.custom_reward_function` (path `pkg://rl_factory.backends.verl.reward`).

verl calls `compute_score(data_source, solution_str, ground_truth, extra_info, **reward_kwargs)` in its
RewardLoopWorker actors, one trajectory at a time, as each rollout finishes. `solution_str` is the
decoded response *including tool observations*, which is not what our rewards score; instead the
trajectory record our agent loop put in `extra_fields` (merged by verl into `extra_info`) is turned
back into a `Trajectory`, and the run's `Scorer` (rewards.scorer: `reward.function` or weighted
`reward.functions`, process rewards with `outcome_mode: sum`, the executor, `timeout_s`, type checks and
`on_error`) scores it exactly as in the embedded backend. The launcher passes our `reward` and
`env.tools` config as `reward_kwargs`.

A reward that names `tools` gets the manifest's tools: the env is opened lazily in the reward worker
and its servers start only if the reward calls one. Component scores and counters come back as
verl's `reward_extra_info` (logged per step by verl).
"""
from __future__ import annotations

import asyncio
import json
from typing import Any

from rl_factory.backends.verl.records import RECORD_KEY, from_record, rollout_line
from rl_factory.backends.verl.run_dir import write_part
from rl_factory.components import open_env
from rl_factory.config import parse, plain
from rewards.scorer import build_scorer

_SCORERS: dict[str, _WorkerScorer] = {}
_LAST: tuple[Any, str] | None = None  # (the reward_kwargs object last seen, its key in _SCORERS)


class _WorkerScorer:
    """The run's `Scorer` and the (lazy) tool env of one reward worker process."""

    def __init__(self, reward_cfg: dict[str, Any], tools: Any, output_dir: str | None = None):
        ours = parse({"reward": reward_cfg, "env": {"tools": tools}})  # the slices verl hands the reward worker
        self.scorer = build_scorer(ours.reward)
        self.output_dir = output_dir  # where the scored rollouts lines go (run_dir.py); None: nowhere
        self.tools_cfg, self.env, self._lock = ours.env, None, asyncio.Lock()

    async def tools(self) -> Any:
        async with self._lock:
            if self.env is None:  # entering starts nothing; a server starts on the reward's first call
                self.env = await open_env(self.tools_cfg).__aenter__()
        return self.env

    async def __call__(self, record: str) -> dict[str, Any]:
        meta = json.loads(record)  # once: the trajectory and its place in the run come from the same dict
        traj = from_record(meta)
        await self.scorer.score(traj, await self.tools())
        result = score_result(self.scorer, traj)
        if self.output_dir:
            write_part(self.output_dir, meta.get("split", "train"), meta.get("step", 0), [rollout_line(meta, traj)])
        return result


def score_result(scorer: Any, traj: Any) -> dict[str, Any]:
    """What verl gets for a scored trajectory (`score`, and the numbers of its reward_info as `reward/<key>`),
    from the reward worker here or from the agent loop when it scored inside the episode."""
    result = {"score": scorer.outcome(traj)}  # plus the process rewards (outcome_mode: sum)
    if scorer.process is not None:
        result["process"] = sum(traj.process_rewards)
    result.update({f"reward/{k}": float(v) for k, v in traj.reward_info.items()
                   if isinstance(v, (int, float)) and not isinstance(v, bool)})
    return result


async def compute_score(data_source: str = None, solution_str: str = None, ground_truth: str = None,
                        extra_info: dict | None = None, rl_factory: Any = None, **_: Any) -> dict[str, Any]:
    """verl's reward call; `rl_factory` = {"reward": our reward config, "tools": env.tools, "output_dir"} (reward_kwargs)."""
    extra_info = extra_info or {}
    if RECORD_KEY not in extra_info:
        raise ValueError(f"sample {extra_info.get('index')}: no {RECORD_KEY} in extra_info; this reward scores "
                         "trajectories of rl_factory's agent loop (set rollout.agent.default_agent_loop=rl_factory)")
    return await _scorer_for(rl_factory)(extra_info[RECORD_KEY])


def _scorer_for(rl_factory: Any) -> _WorkerScorer:
    """The worker's scorer for these reward_kwargs. verl passes the same object with every trajectory: its key
    (a container copy and a sorted JSON dump) is worked out once per object, not once per trajectory."""
    global _LAST
    if _LAST is not None and _LAST[0] is rl_factory:
        return _SCORERS[_LAST[1]]
    settings = plain(rl_factory or {})
    key = json.dumps(settings, sort_keys=True, default=str)
    if key not in _SCORERS:
        _SCORERS[key] = _WorkerScorer(settings.get("reward") or {}, settings.get("tools"), settings.get("output_dir"))
    _LAST = (rl_factory, key)  # the reference keeps the object alive, so `is` cannot meet a recycled id
    return _SCORERS[key]


