"""ArenaRL inside training: one tournament per prompt group, after rewards and before advantages.

`GroupArena` is built from `algorithm.arena` (`ArenaConfig`): it checks the names up front, builds the
judge (`rewards.judge`), and each step turns the groups' trajectories into judge candidates, plays all
groups' tournaments concurrently, appends the rankings to `rankings.csv` (and every match to
`matches.csv`) in the run directory and returns the per-trajectory tournament scores (which the
`arena` estimator z-scores within each group) with the step's `arena/*` metrics:

- `arena/judge_calls`: matches judged (a model judge makes two requests per match, both orders);
- `arena/ties`: matches judged exactly even; `arena/judge_failures`: judge calls that failed after their
  retries; `arena/skipped_groups`: groups dropped by `on_judge_failure=skip_group`;
- `arena/reward_spearman`: mean over groups of the Spearman correlation between tournament scores and the
  pointwise reward (groups where either is constant are left out; absent when none is left);
- `arena/judge_requests`, `arena/judge_cache_hits`, `arena/judge_retries`: the judge's own counters.

Anchors (for the `anchor` and `single_elimination` topologies): `first` is rollout 0; `greedy` is one
extra rollout per prompt at the validation temperature (greedy by default), which the trainer rolls
out and passes in; `reference` is the dataset's answer column as a candidate without a tool path.
"""
from __future__ import annotations

import asyncio
import csv
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rl_factory.algorithms.arena import FAILURE_POLICIES, TournamentResult, get_topology, run_tournament, spearman
from rl_factory.base.types import Group, Trajectory
from rewards.judge import Candidate, JudgeConfig, build_judge
from rewards.loader import prompt_text

ANCHORS = ("first", "greedy", "reference")
RANKINGS_FILE = "rankings.csv"
RANKINGS_COLUMNS = ["step", "group", "prompt", "rollout", "matches", "wins", "losses", "rank", "score"]
# Every judged match between two rollouts (P(a beats b)); the report's win matrix reads it.
MATCHES_FILE = "matches.csv"
MATCHES_COLUMNS = ["step", "group", "prompt", "a", "b", "score"]


@dataclass
class ArenaConfig:
    """`algorithm.arena.*`: tournament topology, anchor, failure policy and judge."""

    topology: str = "round_robin"
    anchor: str = "first"
    rounds: int | None = None
    on_judge_failure: str = "skip_group"
    judge: JudgeConfig = field(default_factory=JudgeConfig)


class GroupArena:
    """Tournaments for a training run (see the module docstring). Use as an async context manager.

    Args:
        cfg: the `algorithm.arena` slice.
        reward_fn: the run's reward (`type: reward` judges compare it).

    Raises:
        KeyError / ValueError: unknown topology, anchor, failure policy or judge settings.
    """

    def __init__(self, cfg: ArenaConfig, reward_fn: Any = None):
        get_topology(cfg.topology)
        if cfg.anchor not in ANCHORS:
            raise ValueError(f"unknown arena anchor {cfg.anchor!r}; valid: {list(ANCHORS)}")
        if cfg.on_judge_failure not in FAILURE_POLICIES:
            raise ValueError(f"unknown on_judge_failure {cfg.on_judge_failure!r}; valid: {list(FAILURE_POLICIES)}")
        if cfg.rounds is not None and cfg.topology != "swiss":
            raise ValueError(f"arena.rounds is a swiss option; topology is {cfg.topology!r}")
        self.cfg = cfg
        self.judge = build_judge(cfg.judge, reward_fn)
        self.rankings: Path | None = None
        self.matches: Path | None = None
        self._judge_stats = dict(getattr(self.judge, "stats", {}))

    @property
    def needs_greedy_anchor(self) -> bool:
        return self.cfg.anchor == "greedy" and self.cfg.topology in ("anchor", "single_elimination")

    def start(self, run_dir: Path, resume_step: int = 0) -> None:
        """Write rankings.csv and matches.csv in run_dir; a resumed run drops the rows of steps >= resume_step."""
        self.rankings, self.matches = run_dir / RANKINGS_FILE, run_dir / MATCHES_FILE
        for path, columns in ((self.rankings, RANKINGS_COLUMNS), (self.matches, MATCHES_COLUMNS)):
            kept = []
            if resume_step and path.exists():
                with path.open(newline="") as f:
                    kept = [row for row in csv.DictReader(f) if int(row["step"]) < resume_step]
            with path.open("w", newline="") as f:
                writer = csv.DictWriter(f, columns)
                writer.writeheader()
                writer.writerows(kept)

    async def score_groups(self, groups: list[Group], step: int, anchors: list[Group] | None = None,
                           group_ids: list[Any] | None = None) -> tuple[list[float], dict[str, float]]:
        """Play every group's tournament; returns ([N] scores in group-then-trajectory order, metrics).

        `group_ids` name the groups in rankings.csv / matches.csv (default: their index in this call).
        The verl backend plays one group per call in each agent-loop worker and passes verl's uid of the
        prompt, so a step's groups stay apart across calls and workers.
        """
        if self.needs_greedy_anchor and anchors is None:
            raise ValueError("arena.anchor=greedy needs one greedy anchor rollout per group")
        anchor_trajs = [a.trajectories[0] for a in anchors] if anchors else [None] * len(groups)
        results = await asyncio.gather(*(self._tournament(g, a) for g, a in zip(groups, anchor_trajs)))
        if self.rankings is not None:
            self._write(step, groups, results, list(range(len(groups))) if group_ids is None else group_ids)
        return [s for r in results for s in r.scores], self._metrics(groups, results)

    async def _tournament(self, group: Group, anchor: Trajectory | None) -> TournamentResult:
        trajs = group.trajectories
        query = prompt_text(trajs[0])
        candidates = [Candidate.from_trajectory(t) for t in trajs]

        async def judge(i: int, j: int) -> float:
            return await self.judge.compare(query, candidates[i], candidates[j])

        outside = self._outside_anchor(trajs[0], anchor)
        anchor_judge = None
        if outside is not None:
            async def anchor_judge(i: int) -> float:
                return await self.judge.compare(query, candidates[i], outside)

        options = {"rounds": self.cfg.rounds} if self.cfg.rounds is not None else {}
        return await run_tournament(self.cfg.topology, len(trajs), judge, anchor_judge=anchor_judge,
                                    on_judge_failure=self.cfg.on_judge_failure, **options)

    def _outside_anchor(self, first: Trajectory, greedy: Trajectory | None) -> Candidate | None:
        if self.cfg.anchor == "greedy" and greedy is not None:
            return Candidate.from_trajectory(greedy)
        if self.cfg.anchor == "reference":
            answer = "" if first.sample.get("answer") is None else str(first.sample["answer"])
            kwargs = {**Candidate.from_trajectory(first).reward_kwargs, "completion": answer, "tool_calls": [],
                      "tool_results": [], "num_turns": 0}
            return Candidate(answer=answer, reward_kwargs=kwargs)
        return None

    def _write(self, step: int, groups: list[Group], results: list[TournamentResult], ids: list[Any]) -> None:
        with self.rankings.open("a", newline="") as f:
            writer = csv.writer(f)
            for gi, group, result in zip(ids, groups, results):
                for i in range(result.n):
                    record = result.record(i)
                    writer.writerow([step, gi, group.sample_index, i, record["matches"], record["wins"],
                                     record["losses"], result.ranks[i], round(result.scores[i], 6)])
        with self.matches.open("a", newline="") as f:
            writer = csv.writer(f)
            for gi, group, result in zip(ids, groups, results):
                writer.writerows([step, gi, group.sample_index, m.a, m.b, round(m.score, 6)]
                                 for m in result.matches if m.b is not None and not m.failed)

    def _metrics(self, groups: list[Group], results: list[TournamentResult]) -> dict[str, float]:
        metrics = {
            "arena/judge_calls": float(sum(r.judge_calls for r in results)),
            "arena/ties": float(sum(r.ties for r in results)),
            "arena/judge_failures": float(sum(r.failures for r in results)),
            "arena/skipped_groups": float(sum(r.skipped for r in results)),
        }
        rhos = [spearman(r.scores, [t.reward for t in g.trajectories]) for g, r in zip(groups, results)
                if all(t.reward is not None for t in g.trajectories)]
        rhos = [rho for rho in rhos if rho == rho]  # NaN: constant scores or rewards
        if rhos:
            metrics["arena/reward_spearman"] = statistics.fmean(rhos)
        stats = dict(getattr(self.judge, "stats", {}))
        for key, value in stats.items():
            metrics[f"arena/judge_{key}"] = float(value - self._judge_stats.get(key, 0))
        self._judge_stats = stats
        return metrics

    async def __aenter__(self) -> GroupArena:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.judge.aclose()
