"""The built-in tournament topologies of ArenaRL (schedules and judge-call budgets: see `arena.py`).

Each is `async fn(arena, **options) -> [n] sort keys` (higher is better; equal keys are ties). Rounds
are played with `arena.play`, which judges a round's matches concurrently. A match scored exactly 0.5
is a tie; where a bracket needs a winner anyway, the rule is stated in the topology's docstring, and a
rollout knocked out by a tie ranks level with the rollout that knocked it out (so a judge that cannot
tell a group's rollouts apart gives them all the same rank, and the group no advantage). The reference
implementation lets the first-listed player win ties and ranks by bracket position alone.
"""
from __future__ import annotations

import math

from rl_factory.algorithms.tournament import Arena, ArenaError, register_topology


async def _anchor_pass(arena: Arena, anchor: int, stage: str) -> list[float]:
    """[n] each rollout's score against the anchor; the inside anchor scores 0.5 against itself."""
    n = arena.n
    if arena.anchor_judge is not None:
        return await arena.play([(i, None) for i in range(n)], stage)
    if not 0 <= anchor < n:
        raise ArenaError(f"anchor={anchor} is not a rollout index (0..{n - 1}); pass an outside anchor "
                         "as anchor_judge instead")
    others = [i for i in range(n) if i != anchor]
    scores = dict(zip(others, await arena.play([(i, anchor) for i in others], stage)))
    scores[anchor] = 0.5  # P(anchor beats itself): between the rollouts it beat and those that beat it
    return [scores[i] for i in range(n)]


@register_topology("anchor")
async def anchor_topology(arena: Arena, anchor: int = 0) -> list[tuple]:
    """Every rollout vs the anchor; key = its score against the anchor."""
    return [(s,) for s in await _anchor_pass(arena, anchor, "anchor")]


@register_topology("round_robin")
async def round_robin(arena: Arena) -> list[tuple]:
    """All pairs in one concurrent round; key = (points, Sonneborn-Berger)."""
    n = arena.n
    pairs = [(i, j) for i in range(n) for j in range(i + 1, n)]
    points, against = [0.0] * n, [[0.0] * n for _ in range(n)]
    for (i, j), s in zip(pairs, await arena.play(pairs, "round_robin")):
        points[i] += s
        points[j] += 1.0 - s
        against[i][j], against[j][i] = s, 1.0 - s
    # Sonneborn-Berger: points earned weighted by the opponent's points (beating strong ones counts more).
    sb = [sum(against[i][j] * points[j] for j in range(n) if j != i) for i in range(n)]
    return [(points[i], sb[i]) for i in range(n)]


def _pairings(order: list[int], met: set[frozenset], budget: list[int]) -> list[tuple[int, int]] | None:
    """Pair players top-down, each with the best-placed opponent not met yet (backtracking).

    None when there is no rematch-free pairing, or when `budget[0]` search steps ran out.
    """
    if not order:
        return []
    first, rest = order[0], order[1:]
    for k, opp in enumerate(rest):
        budget[0] -= 1
        if budget[0] < 0:
            return None
        if frozenset((first, opp)) in met:
            continue
        tail = _pairings(rest[:k] + rest[k + 1:], met, budget)
        if tail is not None:
            return [(first, opp), *tail]
    return None


@register_topology("swiss")
async def swiss(arena: Arena, rounds: int | None = None) -> list[tuple]:
    """Swiss system: each round pairs players of equal standing who have not met.

    Points are the sum of match scores. Round 1 pairs i with i + n/2. An odd player out (the lowest
    standing without a bye yet) gets a bye scored as a draw, 0.5 (FIDE and the reference give 1, which
    lifts a weak rollout over its peers). When no rematch-free pairing exists, rematches are allowed.
    Key = (points, Buchholz = sum of the opponents' points, mean match score).
    """
    n = arena.n
    rounds = min(n - 1, rounds or max(1, math.ceil(math.log2(n))))
    points, opponents = [0.0] * n, [[] for _ in range(n)]
    met: set[frozenset] = set()
    had_bye: set[int] = set()
    for r in range(1, rounds + 1):
        buchholz = [sum(points[o] for o in opponents[i]) for i in range(n)]
        standing = sorted(range(n), key=lambda i: (-points[i], -buchholz[i], i))
        if r == 1:
            half = (n + 1) // 2
            standing = [x for pair in zip(range(half), range(half, n)) for x in pair] + list(range(n - half, half))
        if n % 2:
            bye = next((i for i in reversed(standing) if i not in had_bye), standing[-1])
            had_bye.add(bye)
            points[bye] += 0.5
            standing.remove(bye)
        pairs = (_pairings(standing, met, [10_000])
                 or [(standing[k], standing[k + 1]) for k in range(0, len(standing) - 1, 2)])
        for (a, b), s in zip(pairs, await arena.play(pairs, "swiss", r)):
            points[a] += s
            points[b] += 1.0 - s
            opponents[a].append(b)
            opponents[b].append(a)
            met.add(frozenset((a, b)))
    buchholz = [sum(points[o] for o in opponents[i]) for i in range(n)]
    return [(points[i], buchholz[i], arena.mean_score(i)) for i in range(n)]


def _bracket_order(size: int) -> list[int]:
    """Seed numbers (1-based) in bracket slot order so seeds 1 and 2 can only meet in the final."""
    order = [1]
    while len(order) < size:
        m = 2 * len(order)
        order = [x for seed in order for x in (seed, m + 1 - seed)]
    return order


@register_topology("single_elimination")
async def single_elimination(arena: Arena, anchor: int = 0) -> list[tuple]:
    """An anchor pass seeds a standard bracket (1 v n, ...; byes for the top seeds when n is not a power
    of two). A tied match goes to the better seed. Key = (elimination round, the champion above all;
    seeding score, which every rollout earned against the same anchor).
    """
    n = arena.n
    seed_scores = await _anchor_pass(arena, anchor, "seeding")
    seeds = sorted(range(n), key=lambda i: (-seed_scores[i], i))  # seeds[0] is seed 1
    seed_of = {p: k for k, p in enumerate(seeds)}
    size = 1 << (n - 1).bit_length()
    slots = [seeds[s - 1] if s <= n else None for s in _bracket_order(size)]
    out_round, tie_parent = [0] * n, {}
    r = 0
    while len(slots) > 1:
        r += 1
        pairs = [(a, b) for a, b in zip(slots[::2], slots[1::2]) if a is not None and b is not None]
        results = dict(zip(pairs, await arena.play(pairs, "bracket", r)))
        nxt = []
        for a, b in zip(slots[::2], slots[1::2]):
            if a is None or b is None:
                nxt.append(b if a is None else a)
                continue
            s = results[(a, b)]
            winner = a if s > 0.5 or (s == 0.5 and seed_of[a] < seed_of[b]) else b
            nxt.append(winner)
            _knock_out(b if winner == a else a, winner, s, r, out_round, tie_parent)
        slots = nxt
    out_round[slots[0]] = r + 1
    return _bracket_keys([(out_round[i], seed_scores[i]) for i in range(n)], tie_parent)


def _knock_out(loser: int, winner: int, score: float, r: int, out_round: list[int], tie_parent: dict) -> None:
    out_round[loser] = r
    if score == 0.5:
        tie_parent[loser] = winner


def _bracket_keys(keys: list[tuple], tie_parent: dict[int, int]) -> list[tuple]:
    """Rollouts knocked out by a tie take the key of the rollout that knocked them out (transitively)."""
    def representative(p: int) -> int:
        while p in tie_parent:  # ends at a rollout not knocked out by a tie (the champion at the latest)
            p = tie_parent[p]
        return p

    return [keys[representative(p)] for p in range(len(keys))]


def _interleave(first: list[int], second: list[int]) -> list[int]:
    out = [x for pair in zip(first, second) for x in pair]
    return out + first[len(second):] + second[len(first):]


@register_topology("double_elimination")
async def double_elimination(arena: Arena) -> list[tuple]:
    """Winners and losers brackets played round by round, then one grand final (no bracket reset).

    Round 1 pairs rollouts (0, 1), (2, 3), ... Each round the winners bracket and the losers bracket
    play concurrently; winners-bracket losers drop into the losers bracket interleaved with its
    survivors, so they meet survivors first. A tied match goes to the first-listed player (in the grand
    final: the winners-bracket champion). Key = (elimination round, or above all rounds for the two
    finalists; mean match score).
    """
    n = arena.n
    winners, losers = list(range(n)), []
    out_round, tie_parent = [0] * n, {}
    r = 0
    while not (len(winners) == 1 and len(losers) == 1):
        r += 1
        wb = list(zip(winners[::2], winners[1::2]))
        lb = list(zip(losers[::2], losers[1::2]))
        scores = await arena.play(wb + lb, "winners_losers", r)
        beat = [a if s >= 0.5 else b for (a, b), s in zip(wb + lb, scores)]
        lost = [b if w == a else a for (a, b), w in zip(wb + lb, beat)]
        winners = beat[:len(wb)] + winners[2 * len(wb):]
        survivors = beat[len(wb):] + losers[2 * len(lb):]
        for k in range(len(wb), len(wb) + len(lb)):
            _knock_out(lost[k], beat[k], scores[k], r, out_round, tie_parent)
        losers = _interleave(survivors, lost[:len(wb)])
    (champion_wb,), (champion_lb,) = winners, losers
    s = (await arena.play([(champion_wb, champion_lb)], "grand_final", r + 1))[0]
    first, second = (champion_wb, champion_lb) if s >= 0.5 else (champion_lb, champion_wb)
    out_round[first] = r + 2
    _knock_out(second, first, s, r + 1, out_round, tie_parent)
    return _bracket_keys([(out_round[i], arena.mean_score(i)) for i in range(n)], tie_parent)
