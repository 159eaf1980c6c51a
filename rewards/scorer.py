"""Scoring trajectories as they finish, so the reward stage overlaps the rollouts still running.

    scorer = RewardScorer(reward, tools=env)
    groups = await agent.rollout_groups(samples, indices, n, params, on_done=scorer.submit)
    metrics = await scorer.wait(trajs)   # the last few, then errors and the batch's metrics

`submit` starts scoring one trajectory at once (at most `max_concurrency` reward calls run at a
time); `wait` scores whatever was not submitted, waits for all, and then raises the first
failure in the order of `trajs`, so the error names the same sample on every run however the
rollouts happened to finish. `score_trajectories` is the same thing for a finished batch.
"""
from __future__ import annotations

import asyncio
import statistics
from typing import TYPE_CHECKING, Any

from rewards.combine import Reward
from rewards.loader import RewardTools

if TYPE_CHECKING:
    from rl_factory.types import Trajectory


class RewardScorer:
    """Scores submitted trajectories in the background and reports the batch.

    Args:
        reward: a `Reward` (from `rewards.combine.build_reward`), a `RewardFn` or a plain function.
        tools: the live tool env behind the reward's `tools` argument (None: no tools).
        max_concurrency: reward calls (trajectories) scored at once.
    """

    def __init__(self, reward: Any, tools: Any = None, max_concurrency: int = 64):
        self.reward = Reward.wrap(reward)
        self.tools = tools if isinstance(tools, RewardTools) else RewardTools(tools)
        self.max_concurrency = max_concurrency
        self._semaphore: asyncio.Semaphore | None = None  # made inside the running loop
        self._tasks: dict[int, asyncio.Task] = {}  # id(trajectory) -> its scoring task

    def submit(self, traj: Trajectory) -> None:
        """Start scoring `traj` (from inside the event loop); a second submit is a no-op."""
        if id(traj) not in self._tasks:
            self._tasks[id(traj)] = asyncio.ensure_future(self._score(traj))

    async def _score(self, traj: Trajectory) -> None:
        if self._semaphore is None:
            self._semaphore = asyncio.Semaphore(self.max_concurrency)
        async with self._semaphore:
            traj.reward, traj.reward_info = await self.reward.score(traj, self.tools)

    async def wait(self, trajs: list[Trajectory]) -> dict[str, float]:
        """Score every trajectory of `trajs` (submitted or not) and return the batch's metrics.

        Returns:
            `reward/none_count` (calls that returned None), `reward/errors` (calls that failed and
            scored 0 under `on_error: zero`), `reward/<name>/mean` per named component, and
            `reward/tool_calls` when the reward called tools.

        Raises:
            RewardError: the first failure in the order of `trajs`, naming its sample.
        """
        for traj in trajs:
            self.submit(traj)
        tasks = [self._tasks.pop(id(t)) for t in trajs]
        # return_exceptions: every call finishes before one is reported (see the module docstring).
        results = await asyncio.gather(*tasks, return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                raise result
        return self.metrics(trajs)

    def metrics(self, trajs: list[Trajectory]) -> dict[str, float]:
        infos = [t.reward_info for t in trajs]
        metrics = {"reward/none_count": float(sum(k.endswith("reward_none") for i in infos for k in i)),
                   "reward/errors": float(sum(k.endswith("reward_error") for i in infos for k in i))}
        if self.reward.named and trajs:
            for c in self.reward.components:
                metrics[f"reward/{c.name}/mean"] = statistics.fmean(float(i.get(c.name, 0.0)) for i in infos)
        if self.tools.num_calls:
            metrics["reward/tool_calls"] = float(self.tools.num_calls)
            self.tools.num_calls = 0
        return metrics


async def score_trajectories(reward: Any, trajs: list[Trajectory], max_concurrency: int = 64,
                             tools: Any = None) -> dict[str, float]:
    """Set `traj.reward` and `traj.reward_info` of every trajectory of a finished batch.

    Args:
        reward: a `Reward`, a `RewardFn` (from `load_reward`) or a plain function.
        trajs: the trajectories to score, modified in place.
        max_concurrency: trajectories scored at once.
        tools: the live tool env behind the reward's `tools` argument.

    Returns:
        The batch's metrics (see `RewardScorer.wait`).

    Raises:
        RewardError: naming the first failing trajectory (in list order) by sample index, `id`
            and prompt, chained to the user function's exception.
    """
    return await RewardScorer(reward, tools, max_concurrency).wait(trajs)
