"""Rollout filters on real rollouts: a scripted model, the real calculator and fault servers, the real reward.

Each built-in drops exactly the trajectories it names, logs it, and leaves the survivors as the group;
user filters by file get the arguments they name; bad input names the entry, the filter or the sample.
"""
from __future__ import annotations

import textwrap

import pytest

from rl_factory.config import ConfigError
from rl_factory.data import PromptSampler
from rl_factory.engines.base import SamplingParams
from rl_factory.pipeline import PipelineConfig, PipelineError, RolloutPipeline, build_filters, check_pipeline
from rewards.combine import RewardConfig
from rewards.scorer import build_scorer
from tests.pipeline.conftest import BROKEN, CALL, HANG, row

pytestmark = pytest.mark.anyio

Q = "What is 347 * 29?"
RIGHT, WRONG = "The answer is 10063.", "The answer is 5."
# Both run past the token budget (stop_reason max_tokens); the first has said the right number by then.
LONG_RIGHT, LONG_WRONG = "The answer is 10063, I think, " + "or so, " * 40, "Let me think, " * 40


def make_pipeline(agent, rows, n, filters=(), batch_size=1, **cfg):
    return RolloutPipeline(PipelineConfig(filters=list(filters), **cfg), agent=agent, rows=rows,
                           sampler=PromptSampler(rows, batch_size, shuffle=False), batch_size=batch_size,
                           group_size=n, params=SamplingParams(1.0, 1.0, 40), scorer=build_scorer(RewardConfig()))


async def test_each_builtin_drops_what_it_names(make_agent):
    plans = {Q: [[RIGHT], [WRONG], [LONG_RIGHT], [HANG, RIGHT], [BROKEN, RIGHT], [RIGHT],
                 [CALL.format(expr="347 * 29"), RIGHT]]}
    agent, _ = make_agent(plans, max_response_tokens=40)
    pipeline = make_pipeline(agent, [row(Q, "10063")], n=7,
                             filters=["truncated", "tool_crashed", "malformed", "duplicate", "zero_variance"])
    batch = await pipeline.collect(step=1)

    assert len(batch.trajectories) == 7 and all(t.reward is not None for t in batch.trajectories)
    assert [t.dropped_by for t in batch.trajectories] == [None, None, "truncated", "tool_crashed", "malformed",
                                                          "duplicate", None]
    assert batch.trajectories[2].stop_reason == "max_tokens"
    assert [r.error_kind for r in batch.trajectories[3].tool_results] == ["timeout"]
    assert batch.trajectories[4].tool_calls[0].error is not None
    assert batch.trajectories[5].token_ids == batch.trajectories[0].token_ids  # the later copy goes
    # The group that trains holds only the survivors, in their order.
    assert len(batch.groups) == 1
    assert batch.groups[0].trajectories == [batch.trajectories[i] for i in (0, 1, 6)]
    assert [t.reward for t in batch.kept] == [1.0, 0.0, 1.0]
    for name in ("truncated", "tool_crashed", "malformed", "duplicate"):
        assert batch.metrics[f"filter/{name}/dropped"] == 1.0
    assert batch.metrics["filter/zero_variance/dropped"] == 0.0
    assert batch.metrics["filter/kept_fraction"] == pytest.approx(3 / 7)
    assert batch.metrics["rollout/groups"] == 1.0 and batch.metrics["rollout/prompts"] == 1.0
    assert batch.metrics["rollout/generated_tokens"] == sum(t.num_generated_tokens for t in batch.trajectories)


async def test_zero_variance_drops_groups_without_signal_and_runs_last(make_agent):
    easy, hard = "What is 12 + 30?", "What is 999 * 999?"
    plans = {easy: [["The answer is 42."], ["The answer is 41."]],
             hard: [["The answer is 998001."], ["The answer is 998001."], [LONG_WRONG]]}
    agent, _ = make_agent(plans, max_response_tokens=40)
    rows = [row(easy, "42"), row(hard, "998001")]
    # Listed first, zero_variance still runs after truncated: the hard group is [1, 1, 0] until the
    # truncated 0 goes, and [1, 1] would train nothing.
    pipeline = make_pipeline(agent, rows, n=3, filters=["zero_variance", "truncated"], batch_size=2)
    batch = await pipeline.collect(step=1)
    assert [g.sample_index for g in batch.groups] == [0]
    assert [t.dropped_by for t in batch.trajectories] == [None, None, None, "zero_variance", "zero_variance",
                                                          "truncated"]
    assert batch.metrics["filter/zero_variance/dropped"] == 2.0
    assert batch.metrics["filter/truncated/dropped"] == 1.0


async def test_user_filters_get_the_arguments_they_name(make_agent, tmp_path):
    (tmp_path / "my_filters.py").write_text(textwrap.dedent("""
        def no_fives(completion, reward, stop_reason, topic):
            assert topic == "arith" and stop_reason == "answer" and reward in (0.0, 1.0)
            return not completion.endswith("5.")

        def best_two(rewards, trajectories, prompt, answer):
            assert len(rewards) == len(trajectories) and prompt.startswith("What") and answer == "10063"
            order = sorted(range(len(rewards)), key=lambda i: -rewards[i])[:2]
            return [i in order for i in range(len(rewards))]
    """))
    plans = {Q: [[WRONG], [RIGHT], ["The answer is 10064."], [RIGHT]]}
    agent, _ = make_agent(plans)
    spec = tmp_path / "my_filters.py"
    pipeline = make_pipeline(agent, [row(Q, "10063", topic="arith")], n=4, filters=[
        f"{spec}:no_fives", {"function": f"{spec}:best_two", "level": "group", "name": "top2"}])
    batch = await pipeline.collect(step=1)
    assert [t.dropped_by for t in batch.trajectories] == ["no_fives", None, "top2", None]
    assert batch.metrics["filter/no_fives/dropped"] == 1.0 and batch.metrics["filter/top2/dropped"] == 1.0


async def test_a_raising_user_filter_names_the_sample(make_agent, tmp_path):
    (tmp_path / "bad.py").write_text("def keep(completion):\n    raise ValueError('cannot judge ' + completion)\n"
                                     "def nothing(completion):\n    return None\n"
                                     "def wrong_length(rewards):\n    return [True]\n")
    agent, _ = make_agent({Q: [[RIGHT]]})
    rows = [row(Q, "10063", id="q-17")]
    with pytest.raises(PipelineError) as err:
        await make_pipeline(agent, rows, n=1, filters=[f"{tmp_path / 'bad.py'}:keep"]).collect(step=1)
    message = str(err.value)
    assert "rollout.filters[0] (bad.py:keep) on sample 0 (id 'q-17')" in message
    assert "What is 347 * 29?" in message and "ValueError: cannot judge" in message
    with pytest.raises(PipelineError, match=r"returned NoneType None; a filter returns True \(keep\) or False"):
        await make_pipeline(agent, rows, n=1, filters=[f"{tmp_path / 'bad.py'}:nothing"]).collect(step=1)
    entry = {"function": f"{tmp_path / 'bad.py'}:wrong_length", "level": "group"}
    with pytest.raises(PipelineError, match="the group of sample 0 .* a list of 2 bools"):
        await make_pipeline(agent, rows, n=2, filters=[entry]).collect(step=1)


@pytest.mark.parametrize(("entries", "message"), [
    (["zero_varianse"], "rollout.filters[0]: unknown rollout filter 'zero_varianse'; valid: ['duplicate', "
                        "'malformed', 'tool_crashed', 'truncated', 'zero_variance'] (or a user filter as 'file.py:fn')"),
    ([{"function": "truncated", "kwargs": {"reason": ["x"]}}], "truncated has no option 'reason' (options: ['reasons'])"),
    ([{"function": "duplicate", "level": "trajectory"}], "duplicate is a group-level filter"),
    ([{"function": "x.py:f", "level": "batch"}], "rollout.filters[0].level must be one of"),
    ([{"filter": "truncated"}], "rollout.filters[0] must be a filter name"),
    ([{"function": "truncated", "weight": 2}], "unknown key 'weight'"),
    (["truncated", "truncated"], "filter name 'truncated' is used twice"),
    (["missing_file.py:keep"], "rollout.filters[0]: filter file not found: missing_file.py"),
])
def test_bad_filter_entries_are_named(entries, message):
    with pytest.raises(ConfigError) as err:
        build_filters(entries)
    assert message in str(err.value)


@pytest.mark.parametrize(("cfg", "advantage", "context", "message"), [
    (PipelineConfig(filters=["zero_variance"]), "gae", "append", "gae's advantages are not zero"),
    (PipelineConfig(augment=["per_turn"]), "grpo", "step",
     "rollout.augment=per_turn is not supported on any backend with rollout.context=step"),
    (PipelineConfig(augment=["per_turn"]), "gae", "append", "with algorithm.advantage=gae: "),
    (PipelineConfig(dynamic_sampling={"min_groups": 0}), "grpo", "append", "min_groups must be >= 1"),
    (PipelineConfig(dynamic_sampling={"max_rounds": 0}), "grpo", "append", "max_rounds must be >= 1"),
    (PipelineConfig(augment=["per_tern"]), "grpo", "append", "unknown augmenter 'per_tern'; valid: ['per_turn'"),
])
def test_combinations_the_trainer_cannot_run_are_refused(cfg, advantage, context, message):
    from rl_factory.pipeline import DynamicSamplingConfig
    if isinstance(cfg.dynamic_sampling, dict):
        cfg.dynamic_sampling = DynamicSamplingConfig(**cfg.dynamic_sampling)
    with pytest.raises(ConfigError) as err:
        check_pipeline(cfg, advantage, context)
    assert message in str(err.value)
