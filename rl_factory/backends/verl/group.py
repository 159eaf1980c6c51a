"""ArenaRL on verl: the n rollouts of a prompt meet in their agent-loop worker and play there.

A tournament needs every rollout of a prompt at once. verl hands out a group in exactly one place:
`AgentLoopWorkerTQ._run_prompt` (verl/trainer/ppo/v1/agent_loop_tq.py) starts all n sessions of a
prompt (`uid`) as tasks of one worker process and waits for all of them. So each of our agent loops,
once its trajectory is done, submits it here under its `uid`; the n-th arrival scores the group's
pointwise rewards, plays the tournament with our judge and topology, and every session returns its
tournament score as verl's `reward_score` (verl then skips its reward worker for it). The
`arena` estimator we register in verl (`rl_factory.backends.verl.plugin`) z-scores those scores
within the `uid` group, as in the embedded trainer.

Why not elsewhere: verl's advantage estimators see only token-level rewards and uids (no texts, no
judge), and its reward workers score one trajectory at a time. Consequences, all checked up front
by the launcher: this needs verl's V1 trainer (`trainer.use_v1=true`, the default; the legacy
trainer scatters a group's copies across workers), and `anchor=greedy` is not available (it needs an
extra greedy rollout per prompt that verl does not schedule). Validation prompts (rows marked
`rl_factory_split=val`) are not played: they are scored pointwise by the reward worker.

A session whose rollout raised still reports (as None), so its siblings never wait forever; the
tournament is played among the rollouts that finished. Rankings go to
`<output_dir>/arena/<host>-<pid>/rankings.csv` (one file per worker process, the embedded run's
columns; `group` is verl's uid of the prompt, so each group appears once across the files) and per-group `arena/*` metrics to `metrics.jsonl` beside it.
"""
from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rewards.scorer import build_scorer
from rl_factory import capabilities
from rl_factory.group_arena import GroupArena
from rl_factory.config import RunConfig
from rl_factory.base.types import Group, Trajectory


@dataclass
class _Pending:
    size: int
    trajs: dict[int, Trajectory | None] = field(default_factory=dict)
    done: asyncio.Event = field(default_factory=asyncio.Event)
    scores: dict[int, float] = field(default_factory=dict)
    error: BaseException | None = None


class ArenaGroups:
    """Collects each prompt's n trajectories, then plays its tournament once (module docstring)."""

    def __init__(self, arena: GroupArena, reward: Any, tools: Any, out_dir: Path):
        self.arena, self.reward, self.tools, self.out_dir = arena, reward, tools, out_dir
        self._groups: dict[str, _Pending] = {}

    @classmethod
    def from_config(cls, ours: RunConfig, tools: Any, out_dir: Path) -> ArenaGroups:
        arena_cfg = ours.algorithm.arena
        # the launcher refused it already; a worker given such a config by hand stops here
        capabilities.check("verl", {"algorithm.advantage": ours.algorithm.advantage,
                                    "algorithm.arena.anchor": arena_cfg.anchor})
        reward = build_scorer(ours.reward)
        arena = GroupArena(arena_cfg, reward)
        out_dir.mkdir(parents=True, exist_ok=True)
        arena.start(out_dir)
        return cls(arena, reward, tools, out_dir)

    async def submit(self, uid: str, session: int, traj: Trajectory | None, size: int, step: int) -> float | None:
        """Add one session's trajectory (None: it failed); returns its tournament score once all are in."""
        entry = self._groups.setdefault(uid, _Pending(size))
        entry.trajs[session] = traj
        if len(entry.trajs) == entry.size:
            del self._groups[uid]
            try:
                entry.scores = await self._play(uid, entry, step)
            except BaseException as exc:  # every session of the group reports the failure
                entry.error = exc
            finally:
                entry.done.set()
        else:
            await entry.done.wait()
        if entry.error is not None:
            raise entry.error
        return entry.scores.get(session)

    async def _play(self, uid: str, entry: _Pending, step: int) -> dict[int, float]:
        sessions = sorted(s for s, t in entry.trajs.items() if t is not None)
        trajs = [entry.trajs[s] for s in sessions]
        if not trajs:
            return {}
        # Pointwise rewards first: `judge.type=reward` compares them, and arena/reward_spearman needs them.
        # (those the agent loop scored inside their episode keep that score)
        await self.reward.use_tools(self.tools).wait([t for t in trajs if t.reward is None])
        if len(trajs) == 1:
            return {sessions[0]: 0.0}  # nobody to play; a group of one gets no advantage anyway
        scores, metrics = await self.arena.score_groups([Group(trajs[0].sample_index, trajs)], step,
                                                          group_ids=[uid])
        with (self.out_dir / "metrics.jsonl").open("a") as f:
            f.write(json.dumps({"step": step, "uid": uid, **metrics}) + "\n")
        return dict(zip(sessions, scores))
