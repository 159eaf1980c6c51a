"""Dynamic sampling: more prompts until enough groups survive the filters, at most max_rounds, reproducibly.

"Hard" questions are answered wrong by every trajectory (zero variance: dropped), "easy" ones right by
one of two; the sampler runs in dataset order unless a test shuffles it.
"""
from __future__ import annotations

import logging

import pytest

from rl_factory.data import PromptSampler
from rl_factory.pipeline import DynamicSamplingConfig
from tests.pipeline.test_filters import make_pipeline, row

pytestmark = pytest.mark.anyio

HARD = [f"What is {900 + i} * {800 + i}?" for i in range(12)]
EASY = [f"What is {10 + i} + {20 + i}?" for i in range(12)]


def task(kinds: str) -> tuple[list[dict], dict]:
    """Rows in the order of `kinds` ("h"ard / "e"asy) and the plans that make them so."""
    rows, plans, h, e = [], {}, iter(HARD), iter(EASY)
    for kind in kinds:
        q = next(h) if kind == "h" else next(e)
        a, b = (int(x) for x in q[len("What is "):-1].replace("*", "+").split(" + "))
        answer = a * b if kind == "h" else a + b
        rows.append(row(q, str(answer)))
        plans[q] = [["The answer is 7."], ["The answer is 7."]] if kind == "h" else \
            [[f"The answer is {answer}."], ["The answer is 7."]]
    return rows, plans


async def test_rounds_until_min_groups_survive(make_agent):
    rows, plans = task("hhehee")
    agent, _ = make_agent(plans)
    pipeline = make_pipeline(agent, rows, n=2, filters=["zero_variance"], batch_size=2,
                             dynamic_sampling=DynamicSamplingConfig(min_groups=2, max_rounds=5))
    batch = await pipeline.collect(step=1)
    # round 1: h h (none kept); round 2: e h (1 of 4 prompts kept so far, 1 missing: ceil(1 * 4 / 1) = 4,
    # at most the batch size 2); round 3: e e -> 3 groups >= 2. Every survivor trains.
    assert [g.sample_index for g in batch.groups] == [2, 4, 5]
    assert sorted({t.sample_index for t in batch.trajectories}) == [0, 1, 2, 3, 4, 5]
    assert batch.metrics["rollout/rounds"] == 3.0 and batch.metrics["rollout/prompts"] == 6.0
    assert batch.metrics["rollout/groups"] == 3.0 and batch.metrics["rollout/max_rounds_hit"] == 0.0
    assert batch.metrics["filter/zero_variance/dropped"] == 6.0  # three hard groups of two
    assert batch.metrics["timing/rollout_s"] > 0  # summed over rounds


async def test_max_rounds_stops_and_says_so(make_agent, caplog):
    rows, plans = task("hhhheh")
    agent, _ = make_agent(plans)
    pipeline = make_pipeline(agent, rows, n=2, filters=["zero_variance"], batch_size=2,
                             dynamic_sampling=DynamicSamplingConfig(min_groups=2, max_rounds=2))
    with caplog.at_level(logging.WARNING, logger="rl_factory"):
        batch = await pipeline.collect(step=7)
    assert batch.groups == [] and len(batch.trajectories) == 8
    assert batch.metrics["rollout/rounds"] == 2.0 and batch.metrics["rollout/max_rounds_hit"] == 1.0
    assert "step 7: dynamic sampling drew 4 prompts in 2 rounds (max_rounds) and kept 0 of the 2 groups" in caplog.text


async def test_without_dynamic_sampling_one_round_of_the_batch(make_agent):
    rows, plans = task("hhee")
    agent, _ = make_agent(plans)
    pipeline = make_pipeline(agent, rows, n=2, filters=["zero_variance"], batch_size=2)
    batch = await pipeline.collect(step=1)
    assert batch.groups == [] and batch.metrics["rollout/prompts"] == 2.0 and "rollout/max_rounds_hit" not in batch.metrics


async def test_a_resumed_run_draws_the_prompts_the_killed_one_would(make_agent):
    rows, plans = task("hehehhehheeh")
    cfg = dict(filters=["zero_variance"], batch_size=2, dynamic_sampling=DynamicSamplingConfig(min_groups=2))

    async def run(sampler_state=None, steps=(1, 2)):
        agent, _ = make_agent(plans)
        pipeline = make_pipeline(agent, rows, n=2, **cfg)
        pipeline.sampler = PromptSampler(rows, 2, seed=3)  # shuffled, as in training
        if sampler_state is not None:
            pipeline.sampler.load_state_dict(sampler_state)
        drawn = []
        for step in steps:
            batch = await pipeline.collect(step)
            drawn.append(sorted({t.sample_index for t in batch.trajectories}))
        return drawn, pipeline.sampler.state_dict()

    straight, _ = await run()
    first, state = await run(steps=(1,))  # "killed" after step 1; the checkpoint holds the sampler state
    resumed, _ = await run(sampler_state=state, steps=(2,))
    assert first + resumed == straight
    assert len(straight[0]) > 2  # step 1 needed more than one round
