"""ArenaRL: rollouts of one prompt play a tournament judged pairwise, and ranks become scores.

`await run_tournament(topology, n, judge, **options)` plays rollouts 0..n-1 against each other with
`judge(i, j)`, an async callable returning the probability-like score in [0, 1] that rollout i beats
rollout j, and returns a `TournamentResult`: per-rollout rank-quantile scores, ranks, the matches
played and the number of judge calls. The `arena` advantage estimator z-scores those scores within the
group (rank -> quantile -> z-score -> advantage broadcast to every response token).

One match is one call of `judge`; matches that the schedule allows to run at once (a round) are
gathered concurrently. Judging each comparison both ways (A-B and B-A) to cancel position bias is the
judge's job (`rewards/judge.py` does it), not the tournament's.

Topologies (registry `TOPOLOGIES`, built-ins in `topologies.py`) and judge calls per group of n:

| topology | schedule | judge calls |
|---|---|---|
| `anchor` | every rollout vs the anchor (rollout `anchor`, default 0) | n - 1 (n with an outside anchor) |
| `round_robin` | every pair once | n(n - 1)/2 |
| `swiss` | `rounds` rounds (default ceil(log2 n)), pairing equal points, no rematch | rounds * floor(n/2) |
| `single_elimination` | an anchor pass seeds a standard bracket (1 v n, ...) | 2n - 2 (2n - 1 with an outside anchor) |
| `double_elimination` | winners + losers bracket, one grand final, no reset | 2n - 2 |

(Swiss and double elimination: each match gives exactly one player a result or a loss; a Swiss round
has floor(n/2) matches, and a double elimination ends when n - 2 players have two losses, one has one,
and the grand final is played: 2(n - 2) + 1 + 1 = 2n - 2 matches. Byes never call the judge.)

An outside anchor (a greedy sample, the dataset's reference answer) is never given an index: pass
`anchor_judge(i)`, an async callable scoring rollout i against it, and the anchor pass (of `anchor` and
of `single_elimination`) uses it instead of rollout `anchor`.

Ranking. Each topology returns a sort key per rollout (higher is better). Rollouts with equal keys are
tied: they share the best rank of their block (ranks 1, 2, 2, 4) and the mean of the quantiles
`1 - position / (n - 1)` their block occupies, so the scores always average 0.5 and ties are decided by
the keys alone, never by rollout index. A match whose score is exactly 0.5 is a tie.

Judge failures: the judge raises `rl_factory.base.judging.JudgeError` after its own retries. The tournament
counts it and applies `on_judge_failure`: `tie` (the match scores 0.5 and is marked failed), `skip_group`
(the tournament stops; every rollout gets 0.5, so the group's advantages are 0) or `stop` (raises
`ArenaError`). Never silently.

Departures from the reference implementation (Alibaba-NLP/qqr v0.1.3): a correct Swiss system (the
reference credits points to the wrong players after an in-place shuffle); the inside anchor scores 0.5
against itself (the reference gives it the mean of its matches, on a different scale than the others'
scores against it); a selectable outside anchor; failures counted instead of silently turned into ties;
tied ranks share one averaged quantile in every topology; a rollout knocked out of a bracket by a tied
match ranks level with the rollout that advanced (the reference advances the first-listed player and
ranks by bracket position), so a group the judge cannot tell apart gets no advantage in any topology.
"""
from __future__ import annotations

import inspect
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from rl_factory.algorithms import topologies as _builtin_topologies  # noqa: F401  (registers them)
from rl_factory.algorithms.tournament import (  # noqa: F401  (TOPOLOGIES, register_topology: public names here)
    FAILURE_POLICIES,
    TOPOLOGIES,
    AnchorJudgeFn,
    Arena,
    ArenaError,
    JudgeFn,
    Match,
    _SkipGroup,
    get_topology,
    register_topology,
)


@dataclass
class TournamentResult:
    """The outcome of one group's tournament.

    Attributes:
        topology: registry name.
        scores: [n] rank quantiles in [0, 1] (1 = best; tied rollouts share their mean).
        ranks: [n] 1 = best; tied rollouts share the best rank of their block.
        matches: every match played, in order.
        judge_calls: calls of the judge (and anchor judge), failed ones included.
        failures: judge calls that raised `JudgeError`.
        skipped: the tournament stopped on a failure under `on_judge_failure=skip_group`.
    """

    topology: str
    scores: list[float]
    ranks: list[int]
    matches: list[Match] = field(default_factory=list)
    judge_calls: int = 0
    failures: int = 0
    skipped: bool = False

    @property
    def n(self) -> int:
        return len(self.scores)

    @property
    def ties(self) -> int:
        """Matches judged exactly 0.5 (failed matches scored as ties included)."""
        return sum(m.tie for m in self.matches)

    def record(self, i: int) -> dict[str, int]:
        """Rollout i's matches, wins, losses and ties (a tie is neither a win nor a loss)."""
        out = {"matches": 0, "wins": 0, "losses": 0, "ties": 0}
        for m in self.matches:
            if i not in (m.a, m.b):
                continue
            mine = m.score if m.a == i else 1.0 - m.score
            out["matches"] += 1
            out["wins" if mine > 0.5 else "losses" if mine < 0.5 else "ties"] += 1
        return out



async def run_tournament(topology: str, n: int, judge: JudgeFn, *, anchor_judge: AnchorJudgeFn | None = None,
                         on_judge_failure: str = "tie", **options: Any) -> TournamentResult:
    """Play one group's tournament.

    Args:
        topology: registry name (see the module docstring).
        n: number of rollouts (indices 0..n-1).
        judge: async (i, j) -> float in [0, 1], the chance that rollout i beats rollout j.
        anchor_judge: async (i) -> float, rollout i against an outside anchor (greedy sample or
            reference answer); used by the anchor pass instead of rollout `anchor`.
        on_judge_failure: "tie" | "skip_group" | "stop" (see the module docstring).
        **options: topology options, e.g. `anchor=0` (anchor, single_elimination), `rounds` (swiss).

    Returns:
        The `TournamentResult`.
    """
    fn = get_topology(topology)
    accepted = [p for p in inspect.signature(fn).parameters if p != "arena"]
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        raise ArenaError(f"topology {topology!r} has no option {unknown[0]!r}; its options: {accepted}")
    if n < 1:
        raise ArenaError(f"a tournament needs at least one rollout, got n={n}")
    arena = Arena(n, judge, anchor_judge, on_judge_failure)
    skipped = False
    if n == 1:
        keys: list[tuple] = [()]
    else:
        try:
            keys = await fn(arena, **options)
        except _SkipGroup:
            keys, skipped = [()] * n, True
    ranks, scores = rank_keys(keys)
    return TournamentResult(topology, scores, ranks, arena.matches, arena.judge_calls, arena.failures, skipped)


def rank_keys(keys: Sequence[tuple]) -> tuple[list[int], list[float]]:
    """Ranks (1 = best, ties share the best) and quantile scores (ties share the mean) from sort keys."""
    n = len(keys)
    order = sorted(range(n), key=lambda i: keys[i], reverse=True)
    ranks, scores = [0] * n, [0.5] * n
    start = 0
    while start < n:
        end = start
        while end + 1 < n and keys[order[end + 1]] == keys[order[start]]:
            end += 1
        quantiles = [1.0 - p / (n - 1) for p in range(start, end + 1)] if n > 1 else [0.5]
        for p in range(start, end + 1):
            ranks[order[p]] = start + 1
            scores[order[p]] = sum(quantiles) / len(quantiles)
        start = end + 1
    return ranks, scores


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman rank correlation with average ranks for ties; NaN when either side is constant."""
    rx, ry = _average_ranks(x), _average_ranks(y)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    vx, vy = sum((a - mx) ** 2 for a in rx), sum((b - my) ** 2 for b in ry)
    return cov / math.sqrt(vx * vy) if vx > 0 and vy > 0 else float("nan")


def _average_ranks(values: Sequence[float]) -> list[float]:
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    start = 0
    while start < len(order):
        end = start
        while end + 1 < len(order) and values[order[end + 1]] == values[order[start]]:
            end += 1
        for p in range(start, end + 1):
            ranks[order[p]] = (start + end) / 2
        start = end + 1
    return ranks

