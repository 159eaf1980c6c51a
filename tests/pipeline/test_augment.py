"""Augmenters: every view of a trajectory is token-faithful, and trains with the advantage times its weight.

The trajectory is a real three-turn rollout (two calculator calls, then the answer) of the scripted model;
each view's ids are compared with the ids the engine returned for each turn (`PlanEngine.returned`), not
with the trajectory's own bookkeeping alone.
"""
from __future__ import annotations

import textwrap

import pytest

from rl_factory.config import ConfigError
from rl_factory.engines.base import SamplingParams
from rl_factory.pipeline import PipelineError, augment, build_augmenters
from rl_factory.pipeline.augment import turn_spans
from tests.pipeline.conftest import CALL, row

pytestmark = pytest.mark.anyio

Q = "What is 347 * 29 + 1?"
PLAN = [CALL.format(expr="347 * 29"), CALL.format(expr="10063 + 1"), "The answer is 10064."]


@pytest.fixture()
async def rollout(make_agent):
    """(trajectory, the ids the engine returned for each of its three turns)."""
    agent, engine = make_agent({Q: [PLAN]})
    traj = await agent.rollout(row(Q, "10064"), 0, SamplingParams(1.0, 1.0, 64))
    assert traj.stop_reason == "answer" and [r.text for r in traj.tool_results] == ["10063", "10064"]
    return traj, engine.returned[(Q, 0)]


def trained_ids(step) -> list[int]:
    return [t for t, m in zip(step.token_ids, step.loss_mask) if m]


def check_prefix(traj, step):
    """A prefix of what was generated and appended (nothing re-rendered), with the recorded log-probs."""
    n = len(step.token_ids)
    assert step.token_ids == traj.token_ids[:n]
    assert all(m <= m0 for m, m0 in zip(step.loss_mask, traj.loss_mask))  # trains generated tokens only
    assert step.logprobs == [lp if m else 0.0 for lp, m in zip(traj.logprobs[:n], step.loss_mask)]


async def test_per_turn_views_are_the_engine_turns_with_their_exact_prefix(rollout):
    traj, generated = rollout
    metrics = await augment(build_augmenters(["per_turn"]), [traj])
    assert metrics == {"augment/per_turn/samples": 3.0, "augment/samples_per_trajectory": 3.0}
    assert [trained_ids(s) for s in traj.steps] == generated  # each view trains exactly one turn
    for k, step in enumerate(traj.steps):
        check_prefix(traj, step)
        assert step.token_ids[len(step.token_ids) - len(generated[k]):] == generated[k]  # it ends with it
        assert step.weight == 1.0
    # the prompt of turn k is the prompt, the earlier turns and their tool results, as the engine saw it
    assert len(traj.steps[1].token_ids) - len(generated[1]) == len(traj.prompt_ids) + len(generated[0]) + \
        len(traj.turns[0].observation_ids)
    traj.advantage = 0.5
    assert [s.advantage for s in traj.training_samples()] == [0.5, 0.5, 0.5]


async def test_tool_prefix_views_continue_after_each_tool_result(rollout):
    traj, generated = rollout
    await augment(build_augmenters([{"function": "tool_prefix", "kwargs": {"decay": 0.5}}]), [traj])
    spans = turn_spans(traj)
    assert len(traj.steps) == 3  # the whole trajectory, after result 1, after result 2
    for k, step in enumerate(traj.steps):
        check_prefix(traj, step)
        assert step.token_ids == traj.token_ids  # each target runs to the end of the trajectory
        context_end = len(traj.prompt_ids) if k == 0 else spans[k - 1].obs_end
        assert set(step.loss_mask[:context_end]) == {0}
        assert trained_ids(step) == [i for g in generated[k:] for i in g]  # the engine's turns from k on
    total = 1 + 0.5 + 0.25
    assert [s.weight for s in traj.steps] == pytest.approx([1 / total, 0.5 / total, 0.25 / total])
    traj.advantage = -2.0
    assert [s.advantage for s in traj.training_samples()] == pytest.approx([-2 / total, -1 / total, -0.5 / total])


async def test_several_augmenters_add_up_and_user_views_are_checked(rollout, tmp_path):
    traj, generated = rollout
    (tmp_path / "views.py").write_text(textwrap.dedent("""
        def last_turn(trajectory, spans, reward):
            last = spans[-1]
            return [(last.gen_start, last.gen_end, 2.0)]

        def empty_view(spans):
            return [(0, spans[0].gen_start)]

        def negative(spans):
            return [(spans[0].gen_start, spans[0].gen_end, -1.0)]
    """))
    spec = tmp_path / "views.py"
    metrics = await augment(build_augmenters(["per_turn", f"{spec}:last_turn"]), [traj])
    assert metrics["augment/per_turn/samples"] == 3.0 and metrics["augment/last_turn/samples"] == 1.0
    assert trained_ids(traj.steps[-1]) == generated[-1] and traj.steps[-1].weight == 2.0
    with pytest.raises(PipelineError, match=r"rollout.augment\[0\] \(views.py:empty_view\) on sample 0 .*"
                                            r"holds no generated token"):
        await augment(build_augmenters([f"{spec}:empty_view"]), [traj])
    with pytest.raises(PipelineError, match="view weight -1.0 must be a finite number >= 0"):
        await augment(build_augmenters([f"{spec}:negative"]), [traj])


async def test_views_need_one_token_stream(make_agent):
    agent, _ = make_agent({Q: [PLAN]}, context="step")
    traj = await agent.rollout(row(Q, "10064"), 0, SamplingParams(1.0, 1.0, 64))
    with pytest.raises(ValueError, match="augmenters need rollout.context=append"):
        await augment(build_augmenters(["per_turn"]), [traj])


def test_bad_augmenter_entries_are_named():
    with pytest.raises(ConfigError, match=r"rollout.augment\[1\]: unknown augmenter 'tool_prefx'; valid: "
                                          r"\['per_turn', 'tool_prefix'\]"):
        build_augmenters(["per_turn", "tool_prefx"])
    with pytest.raises(ConfigError, match="tool_prefix has no option 'gamma'"):
        build_augmenters([{"function": "tool_prefix", "kwargs": {"gamma": 0.9}}])
    with pytest.raises(ConfigError, match="augmenter file not found"):
        build_augmenters(["nowhere.py:views"])
