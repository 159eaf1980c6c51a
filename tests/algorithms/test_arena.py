"""ArenaRL tournaments against a simulated judge over hidden true qualities.

The noise-free judge says 1 when i's hidden quality is higher (0.5 on equal quality); the noisy one
draws the verdict from a Bradley-Terry model, P(i beats j) = sigmoid((q_i - q_j) / 0.1), q ~ N(0, 1).
"""
import asyncio
import math
import random
import statistics

import pytest

from rl_factory.algorithms.advantages import compute_advantages
from rl_factory.algorithms.arena import (
    TOPOLOGIES,
    ArenaError,
    rank_keys,
    register_topology,
    run_tournament,
    spearman,
)
from rewards.judge import JudgeError

N, GROUPS = 8, 100
BUDGET = {"anchor": N - 1, "round_robin": N * (N - 1) // 2, "swiss": 3 * (N // 2),
          "single_elimination": 2 * N - 2, "double_elimination": 2 * N - 2}
MIN_SPEARMAN = {"round_robin": 0.95, "double_elimination": 0.85, "swiss": 0.8, "single_elimination": 0.75,
                "anchor": 0.5}


def simulated_judge(quality, noise=0.0, rng=None, n=None):
    n = len(quality) if n is None else n

    async def judge(i, j):
        assert 0 <= i < n and 0 <= j < n and i != j  # only indices of rollouts that exist
        await asyncio.sleep(0)
        if noise == 0:
            return 1.0 if quality[i] > quality[j] else 0.0 if quality[i] < quality[j] else 0.5
        return 1.0 if rng.random() < 1 / (1 + math.exp(-(quality[i] - quality[j]) / noise)) else 0.0

    return judge


async def play_groups(topology, noise, seed=0):
    rng = random.Random(seed)
    rhos, calls = [], set()
    for _ in range(GROUPS):
        quality = [rng.gauss(0, 1) for _ in range(N)]
        result = await run_tournament(topology, N, simulated_judge(quality, noise, rng))
        rhos.append(spearman(result.scores, quality))
        calls.add(result.judge_calls)
        assert len(result.matches) == result.judge_calls and result.failures == 0
    return statistics.fmean(rhos), calls


@pytest.mark.parametrize("noise", [0.0, 0.1], ids=["noise_free", "noisy"])
@pytest.mark.parametrize("topology", sorted(BUDGET))
def test_tournament_recovers_true_quality_within_budget(topology, noise):
    rho, calls = asyncio.run(play_groups(topology, noise))
    assert rho >= MIN_SPEARMAN[topology], (topology, noise, rho)
    assert calls == {BUDGET[topology]}


def test_registry_and_options():
    assert set(BUDGET) <= set(TOPOLOGIES)
    judge = simulated_judge(list(range(4)))
    with pytest.raises(KeyError, match="unknown tournament topology 'swis'; valid: .*'swiss'"):
        asyncio.run(run_tournament("swis", 4, judge))
    with pytest.raises(ArenaError, match="'round_robin' has no option 'rounds'"):
        asyncio.run(run_tournament("round_robin", 4, judge, rounds=2))
    with pytest.raises(ValueError, match="already registered"):
        register_topology("swiss")(lambda arena: [])


@pytest.mark.parametrize("topology, widest_round", [("anchor", 7), ("round_robin", 28), ("swiss", 4),
                                                     ("single_elimination", 7), ("double_elimination", 4)])
def test_matches_of_a_round_run_concurrently(topology, widest_round):
    in_flight, peak = 0, 0

    async def judge(i, j):
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        await asyncio.sleep(0.001)
        in_flight -= 1
        return 1.0 if i < j else 0.0

    asyncio.run(run_tournament(topology, N, judge))
    assert peak == widest_round


def test_swiss_credits_points_to_the_right_players():
    # The reference implementation shuffles its player list in place and then credits points by list
    # position (Spearman ~ 0). Here a rollout with more wins always ranks above one with fewer, and the
    # true best is the Swiss winner in every group.
    rng = random.Random(1)
    for _ in range(50):
        quality = [rng.gauss(0, 1) for _ in range(N)]
        result = asyncio.run(run_tournament("swiss", N, simulated_judge(quality)))
        wins = [result.record(i)["wins"] for i in range(N)]
        for i in range(N):
            assert result.record(i)["matches"] == 3
            assert wins[i] == sum(1 for m in result.matches if i in (m.a, m.b)
                                  and quality[i] > quality[m.b if m.a == i else m.a])
            for j in range(N):
                if wins[i] > wins[j]:
                    assert result.ranks[i] < result.ranks[j]
        assert result.ranks[max(range(N), key=quality.__getitem__)] == 1
        assert len({frozenset((m.a, m.b)) for m in result.matches}) == 12  # no rematches


def test_swiss_with_every_round_played_recovers_the_exact_order():
    rng = random.Random(2)
    for _ in range(50):
        quality = [rng.gauss(0, 1) for _ in range(4)]
        result = asyncio.run(run_tournament("swiss", 4, simulated_judge(quality), rounds=3))
        assert spearman(result.scores, quality) == pytest.approx(1.0)


def test_odd_groups_and_byes():
    quality = [0.3, 0.9, 0.1, 0.5, 0.7]
    for topology in BUDGET:
        result = asyncio.run(run_tournament(topology, 5, simulated_judge(quality)))
        assert sorted(result.ranks)[0] == 1 and len(result.scores) == 5
        assert statistics.fmean(result.scores) == pytest.approx(0.5)
    calls = {t: asyncio.run(run_tournament(t, 5, simulated_judge(quality))).judge_calls for t in BUDGET}
    assert calls == {"anchor": 4, "round_robin": 10, "swiss": 3 * 2, "single_elimination": 8,
                     "double_elimination": 8}
    assert asyncio.run(run_tournament("round_robin", 1, simulated_judge([1.0]))).scores == [0.5]


def test_outside_anchor_is_never_an_index():
    quality = [0.2, 0.8, 0.5, 0.1]
    anchor_quality = 0.4  # e.g. the dataset's reference answer

    async def anchor_judge(i):
        return 1.0 if quality[i] > anchor_quality else 0.0

    result = asyncio.run(run_tournament("anchor", 4, simulated_judge(quality), anchor_judge=anchor_judge))
    assert result.judge_calls == 4 and all(m.b is None for m in result.matches)
    assert result.ranks == [3, 1, 1, 3] and result.scores == pytest.approx([1 / 6, 5 / 6, 5 / 6, 1 / 6])
    seeded = asyncio.run(run_tournament("single_elimination", 4, simulated_judge(quality),
                                        anchor_judge=anchor_judge))
    assert seeded.judge_calls == 4 + 3 and seeded.ranks[1] == 1
    with pytest.raises(ArenaError, match="anchor=4 is not a rollout index"):
        asyncio.run(run_tournament("anchor", 4, simulated_judge(quality), anchor=4))


def test_inside_anchor_sits_between_those_it_beats_and_those_that_beat_it():
    quality = [0.5, 0.9, 0.1, 0.7, 0.3]
    result = asyncio.run(run_tournament("anchor", 5, simulated_judge(quality), anchor=0))
    assert result.ranks == [3, 1, 4, 1, 4]
    assert [m.b for m in result.matches] == [0, 0, 0, 0]


def test_ranks_and_quantiles_share_ties():
    ranks, scores = rank_keys([(2,), (1,), (2,), (0,)])
    assert ranks == [1, 3, 1, 4]
    assert scores == pytest.approx([5 / 6, 1 / 3, 5 / 6, 0.0])
    ranks, scores = rank_keys([(1, 0.5)] * 3)
    assert ranks == [1, 1, 1] and scores == [0.5, 0.5, 0.5]


def test_a_judge_that_always_ties_gives_no_signal():
    async def judge(i, j):
        return 0.5

    for topology in BUDGET:
        result = asyncio.run(run_tournament(topology, 6, judge))
        assert result.scores == [0.5] * 6 and result.ranks == [1] * 6, topology  # never broken by index
        assert result.ties == result.judge_calls


def test_knocked_out_by_a_tie_ranks_with_the_winner():
    # Qualities 2 = 2 > 1 = 1. Single elimination (anchor 0): 0 and 1 both reach the final and tie it.
    # Double elimination: (0, 1) and (2, 3) tie in round 1, and 0 and 1 tie again in the grand final.
    # Either way the bracket needs a winner, but the one knocked out by the tie ranks level with it.
    quality = [2, 2, 1, 1]
    single = asyncio.run(run_tournament("single_elimination", 4, simulated_judge(quality)))
    assert single.ranks == [1, 1, 3, 3]
    double = asyncio.run(run_tournament("double_elimination", 4, simulated_judge(quality)))
    assert double.ranks[:2] == [1, 1] and double.ranks[2:] != [1, 1]


def failing_judge(bad_pair):
    async def judge(i, j):
        if {i, j} == bad_pair:
            raise JudgeError("endpoint returned garbage 3 times")
        return 1.0 if i < j else 0.0

    return judge


def test_judge_failure_policies():
    tie = asyncio.run(run_tournament("round_robin", 4, failing_judge({1, 2}), on_judge_failure="tie"))
    assert tie.failures == 1 and tie.judge_calls == 6 and not tie.skipped
    failed = [m for m in tie.matches if m.failed]
    assert len(failed) == 1 and failed[0].score == 0.5 and {failed[0].a, failed[0].b} == {1, 2}

    skip = asyncio.run(run_tournament("round_robin", 4, failing_judge({1, 2}), on_judge_failure="skip_group"))
    assert skip.skipped and skip.failures == 1 and skip.scores == [0.5] * 4
    adv = compute_advantages("arena", [0.0] * 4, [0] * 4, scores=skip.scores)
    assert adv.abs().max() == 0  # a skipped group trains nothing

    with pytest.raises(ArenaError, match="judge failed on match 1 vs 2 .*stop.*garbage"):
        asyncio.run(run_tournament("round_robin", 4, failing_judge({1, 2}), on_judge_failure="stop"))
    with pytest.raises(ArenaError, match="unknown on_judge_failure 'ignore'"):
        asyncio.run(run_tournament("round_robin", 4, failing_judge({1, 2}), on_judge_failure="ignore"))


def test_judge_must_return_a_probability():
    async def judge(i, j):
        return 7.0

    with pytest.raises(ArenaError, match="judge returned 7.0"):
        asyncio.run(run_tournament("anchor", 3, judge))


def test_scores_become_group_zscored_advantages():
    quality = [0.1, 0.4, 0.3, 0.9]
    result = asyncio.run(run_tournament("round_robin", 4, simulated_judge(quality)))
    assert result.scores == pytest.approx([0.0, 2 / 3, 1 / 3, 1.0])
    assert [result.record(i)["wins"] for i in range(4)] == [0, 2, 1, 3]
    adv = compute_advantages("arena", [0.0] * 4, [7] * 4, scores=result.scores)
    assert adv.argsort().tolist() == [0, 2, 1, 3] and abs(adv.sum().item()) < 1e-6
