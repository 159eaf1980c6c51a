"""A dropped trajectory is treated as never sampled: every estimator sees only the survivors of its group.

One prompt, four trajectories: right, wrong, wrong, and a right one that runs past the token budget and
is dropped by `truncated`. The survivors' rewards are [1, 0, 0] (k = 3, n = 4); the expected advantages
are worked out by hand here, so counting the dropped one (or dividing by n) would fail.
"""
from __future__ import annotations

import math

import pytest

from rl_factory.algorithms.advantages import assign_advantages
from rl_factory.group_arena import ArenaConfig
from rl_factory.config import ConfigError
from rl_factory.critic import assign_with_critic
from rl_factory.pipeline import PipelineConfig, check_pipeline
from rl_factory.providers import ProviderContext, build_providers
from rl_factory.update import AlgorithmConfig
from rewards.combine import RewardConfig
from rewards.scorer import build_scorer
from tests.pipeline.test_filters import LONG_RIGHT, make_pipeline, row

pytestmark = pytest.mark.anyio

Q1, Q2 = "What is 347 * 29?", "What is 12 + 30?"
PLANS = {Q1: [["The answer is 10063."], ["The answer is 5."], ["The answer is 6."], [LONG_RIGHT]],
         Q2: [["The answer is 42."], ["The answer is 40."]]}


@pytest.fixture()
async def batch(make_agent):
    agent, _ = make_agent(PLANS, max_response_tokens=40)
    rows = [row(Q1, "10063"), row(Q2, "42")]
    pipeline = make_pipeline(agent, rows, n=4, filters=["truncated"], batch_size=1)
    return await pipeline.collect(step=1)


def advantages(batch, name, **options):
    return assign_advantages(name, batch.groups, **options).tolist()


async def test_the_group_is_its_survivors(batch):
    assert [t.reward for t in batch.trajectories] == [1.0, 0.0, 0.0, 1.0]
    assert batch.trajectories[3].dropped_by == "truncated"
    assert [t.reward for t in batch.kept] == [1.0, 0.0, 0.0]


async def test_grpo_uses_the_survivors_mean_and_std(batch):
    std = math.sqrt(((2 / 3) ** 2 + 2 * (1 / 3) ** 2) / 2)  # unbiased, over k = 3
    assert advantages(batch, "grpo") == pytest.approx([v / std for v in (2 / 3, -1 / 3, -1 / 3)], abs=1e-5)
    assert batch.trajectories[3].advantage is None  # the dropped one gets none and does not train


async def test_dr_grpo_uses_the_survivors_mean(batch):
    assert advantages(batch, "dr_grpo") == pytest.approx([2 / 3, -1 / 3, -1 / 3], abs=1e-6)


async def test_rloo_leaves_out_one_of_the_k_survivors_not_of_n(batch):
    # r_i - mean of the other survivors: 1 - 0, 0 - (1 + 0) / 2, 0 - (1 + 0) / 2
    assert advantages(batch, "rloo") == pytest.approx([1.0, -0.5, -0.5], abs=1e-6)


async def test_reinforce_pp_whitens_over_the_kept_trajectories_only(make_agent):
    agent, _ = make_agent(PLANS, max_response_tokens=40)
    pipeline = make_pipeline(agent, [row(Q1, "10063"), row(Q2, "42")], n=4, filters=["truncated"], batch_size=2)
    batch = await pipeline.collect(step=1)
    # group 2 plays its two plans twice: rewards [1, 0, 1, 0]; each group centred on its survivors' mean
    centred = [2 / 3, -1 / 3, -1 / 3] + [0.5, -0.5, 0.5, -0.5]
    mean = sum(centred) / len(centred)
    var = sum((c - mean) ** 2 for c in centred) / (len(centred) - 1)
    expected = [(c - mean) / math.sqrt(var + 1e-8) for c in centred]
    assert advantages(batch, "reinforce_pp") == pytest.approx(expected, abs=1e-5)


async def test_arena_plays_among_the_survivors(make_agent):
    agent, _ = make_agent(PLANS, max_response_tokens=40)
    reward = build_scorer(RewardConfig())
    alg = AlgorithmConfig(advantage="arena", arena=ArenaConfig(topology="round_robin"))
    async with build_providers(ProviderContext(alg, reward)) as providers:  # the trainer's tournament
        pipeline = make_pipeline(agent, [row(Q1, "10063")], n=4, filters=["truncated"])
        pipeline.group_stage = providers.group_stage
        batch = await pipeline.collect(step=1)
    assert batch.metrics["arena/judge_calls"] == 3.0  # C(3, 2) among the survivors, not C(4, 2)
    assert len(batch.scores) == 3
    adv = advantages(batch, "arena", scores=batch.scores)
    # the right answer wins both of its matches, the two wrong ones tie: z-scores of [1, 0, 0]
    assert adv[0] > 0 > adv[1] and adv[1] == adv[2] and abs(sum(adv)) < 1e-5


async def test_gae_whitens_over_the_kept_tokens_and_refuses_zero_variance(batch):
    kept = batch.kept
    assign_with_critic("gae", kept, [[0.0] * len(t.token_ids) for t in kept])
    total = sum(a for t in kept for a, m in zip(t.token_advantages, t.loss_mask) if m)
    assert abs(total) < 1e-6  # whitened to mean 0 over the survivors' tokens
    assert batch.trajectories[3].token_advantages is None
    with pytest.raises(ConfigError, match="gae's advantages are not zero"):
        check_pipeline(PipelineConfig(filters=["zero_variance"]), "gae", "append")


async def test_a_step_whose_every_trajectory_was_dropped_trains_nothing(make_agent):
    agent, _ = make_agent({Q1: [["The answer is 5."]]})
    batch = await make_pipeline(agent, [row(Q1, "10063")], n=2, filters=["zero_variance"]).collect(step=1)
    assert batch.groups == [] and batch.kept == [] and len(batch.trajectories) == 2
    assert assign_advantages("grpo", batch.groups).numel() == 0  # what the trainer then calls
    assert assign_with_critic("gae", batch.kept, []) == {}
