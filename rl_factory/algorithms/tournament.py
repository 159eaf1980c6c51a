"""The tournament's moving parts: the topology registry, the failure policies, and `Arena`, which plays a
topology's matches against the judge. `arena.py` (run_tournament, ranking) is the front; the built-in
topologies (`topologies.py`) register here, so neither of those two imports the other.
"""
from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from rl_factory.base.errors import UserError
from rl_factory.base.judging import JudgeError
from rl_factory.base.registry import Registry

JudgeFn = Callable[[int, int], Awaitable[float]]
AnchorJudgeFn = Callable[[int], Awaitable[float]]
TopologyFn = Callable[..., Awaitable[list[tuple]]]
TOPOLOGIES: Registry[TopologyFn] = Registry("tournament topology")
FAILURE_POLICIES = ("tie", "skip_group", "stop")


class ArenaError(UserError, ValueError):
    """A judge failed under `on_judge_failure=stop`, a judge returned a non-probability, or a tournament
    was misconfigured: all things the user fixes (endpoint, judge, config), so the CLI prints one line."""


class _SkipGroup(Exception):
    """Internal: a judge failed under `on_judge_failure=skip_group`."""


@dataclass
class Match:
    """One judged comparison: `score` is P(a beats b); `b` is None for the outside anchor."""

    stage: str
    round: int
    a: int
    b: int | None
    score: float
    failed: bool = False

    @property
    def tie(self) -> bool:
        return self.score == 0.5


# A topology is `async fn(arena: Arena, **options) -> list of n sort keys` (higher is better).
register_topology, get_topology = TOPOLOGIES.register, TOPOLOGIES.lookup


class Arena:
    """Plays the matches of one tournament: calls the judge, applies the failure policy, logs matches.

    Args:
        n: number of rollouts.
        judge: async (i, j) -> P(i beats j).
        anchor_judge: async (i) -> P(i beats the outside anchor), or None.
        on_judge_failure: one of `FAILURE_POLICIES`.
    """

    def __init__(self, n: int, judge: JudgeFn, anchor_judge: AnchorJudgeFn | None = None,
                 on_judge_failure: str = "tie"):
        if on_judge_failure not in FAILURE_POLICIES:
            raise ArenaError(f"unknown on_judge_failure {on_judge_failure!r}; valid: {list(FAILURE_POLICIES)}")
        self.n, self.judge, self.anchor_judge = n, judge, anchor_judge
        self.on_judge_failure = on_judge_failure
        self.matches: list[Match] = []
        self.judge_calls = self.failures = 0

    async def play(self, pairs: Sequence[tuple[int, int | None]], stage: str, round: int = 0) -> list[float]:
        """Judge `pairs` concurrently (b None = the outside anchor); returns P(a beats b) per pair."""
        results = await asyncio.gather(*(self._judge_one(a, b) for a, b in pairs))
        failed = [(pair, err) for pair, (_, err) in zip(pairs, results) if err is not None]
        if failed and self.on_judge_failure == "stop":
            (a, b), err = failed[0]
            raise ArenaError(f"judge failed on match {a} vs {'anchor' if b is None else b} "
                             f"(on_judge_failure=stop): {err}") from err
        if failed and self.on_judge_failure == "skip_group":
            raise _SkipGroup()
        scores = [0.5 if err is not None else score for score, err in results]
        for (a, b), score, (_, err) in zip(pairs, scores, results):
            self.matches.append(Match(stage, round, a, b, score, failed=err is not None))
        return scores

    async def _judge_one(self, a: int, b: int | None) -> tuple[float, JudgeError | None]:
        self.judge_calls += 1
        try:
            score = await (self.anchor_judge(a) if b is None else self.judge(a, b))
        except JudgeError as exc:
            self.failures += 1
            return 0.5, exc
        score = float(score)
        if not 0.0 <= score <= 1.0:  # NaN fails this too
            raise ArenaError(f"judge returned {score} for {a} vs {b}; expected a probability in [0, 1]")
        return score, None

    def mean_score(self, i: int) -> float:
        """Rollout i's mean score over its matches so far (0.5 if it has none): a tie-breaker."""
        mine = [m.score if m.a == i else 1.0 - m.score for m in self.matches if i in (m.a, m.b)]
        return sum(mine) / len(mine) if mine else 0.5
