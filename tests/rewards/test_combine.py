"""Several reward functions with weights, built from the `reward:` config slice."""
import asyncio
import textwrap

import pytest

from rewards.combine import DEFAULT_FUNCTION, RewardConfig
from rewards.scorer import build_scorer
from rewards.loader import RewardLoadError
from rewards.scorer import score_trajectories
from rl_factory.types import Trajectory, Turn

REWARDS = """
def correct(completion, answer):
    return float(answer in completion)


def short(completion, limit=20):
    return {"score": float(len(completion) <= limit), "chars": len(completion)}


def abstain(completion):
    return None
"""


def make_traj(completion, answer="42", sample_index=0):
    sample = {"prompt": "What is 6 * 7?", "answer": answer, "messages": [{"role": "user", "content": "q"}]}
    return Trajectory(sample_index=sample_index, prompt_ids=[0], token_ids=[0, 1], loss_mask=[0, 1],
                      logprobs=[0.0, -0.1], messages=[], turns=[Turn([1], [-0.1], completion)],
                      stop_reason="answer", sample=sample)


@pytest.fixture
def reward_file(tmp_path):
    path = tmp_path / "my_rewards.py"
    path.write_text(textwrap.dedent(REWARDS))
    return path


def test_weighted_components_are_summed_kept_and_logged(reward_file):
    reward = build_scorer(RewardConfig(functions=[
        {"function": f"{reward_file}:correct", "weight": 1.0, "name": "correct"},
        {"function": f"{reward_file}:short", "weight": 0.5, "kwargs": {"limit": 10}},
    ]))
    trajs = [make_traj("42"), make_traj("it is 42, surely"), make_traj("no idea")]
    metrics = asyncio.run(score_trajectories(reward, trajs))
    assert [t.reward for t in trajs] == [1.5, 1.0, 0.5]
    assert trajs[1].reward_info == {"correct": 1.0, "short": 0.0, "short/chars": 16}
    assert metrics == {"reward/none_count": 0.0, "reward/errors": 0.0,
                       "reward/correct/mean": pytest.approx(2 / 3), "reward/short/mean": pytest.approx(2 / 3)}
    assert reward.name == "1*correct + 0.5*short"


def test_single_function_keeps_its_own_keys(reward_file):
    reward = build_scorer(RewardConfig(function=f"{reward_file}:short"))
    traj = make_traj("42")
    metrics = asyncio.run(score_trajectories(reward, [traj]))
    assert (traj.reward, traj.reward_info) == (1.0, {"chars": 2})
    assert "reward/short/mean" not in metrics


def test_none_of_a_component_is_counted(reward_file):
    reward = build_scorer(RewardConfig(functions=[f"{reward_file}:correct", f"{reward_file}:abstain"]))
    traj = make_traj("42")
    metrics = asyncio.run(score_trajectories(reward, [traj]))
    assert traj.reward == 1.0 and traj.reward_info == {"correct": 1.0, "abstain": 0.0, "abstain/reward_none": 1.0}
    assert metrics["reward/none_count"] == 1.0


def test_default_is_the_calculator_reward():
    reward = build_scorer(RewardConfig())
    assert reward.components[0].fn.spec == DEFAULT_FUNCTION
    traj = make_traj("so 7212.", answer="7212")
    asyncio.run(score_trajectories(reward, [traj]))
    assert traj.reward == 1.0


@pytest.mark.parametrize("functions, match", [
    ([{"function": "rewards.exact_match:numeric_exact_match", "wieght": 2}],
     r"reward.functions\[0\]: unknown key 'wieght' \(valid: function, weight, name, kwargs\)"),
    ([{"weight": 2}], r"reward.functions\[0\] must be a mapping with a `function`"),
    ([{"function": "rewards.exact_match:numeric_exact_match", "weight": "high"}], r"weight must be a number"),
    (["rewards.exact_match:numeric_exact_match", "rewards.exact_match:numeric_exact_match"],
     "name 'numeric_exact_match' is used twice"),
    (["rewards.exact_match:nope"], r"reward.functions\[0\]: reward function 'nope' not found"),
    ([{"function": "{file}:short", "kwargs": {"limt": 1}}], r"has no parameter 'limt'.*\['completion', 'limit'\]"),
])
def test_bad_functions_entries_name_the_entry(functions, match, reward_file):
    functions = [{**f, "function": f["function"].replace("{file}", str(reward_file))} if isinstance(f, dict)
                 and "function" in f else f for f in functions]
    with pytest.raises(RewardLoadError, match=match):
        build_scorer(RewardConfig(functions=functions))


def test_function_and_functions_together_is_an_error():
    with pytest.raises(RewardLoadError, match="both set"):
        build_scorer(RewardConfig(function="rewards.exact_match:numeric_exact_match",
                                  functions=["rewards.exact_match:numeric_exact_match"]))
    with pytest.raises(RewardLoadError, match="reward.on_error: unknown value 'ignore' \\(valid: raise, zero\\)"):
        build_scorer(RewardConfig(on_error="ignore"))
    with pytest.raises(RewardLoadError, match="reward.executor: unknown executor 'gpu' \\(valid: inline, thread"):
        build_scorer(RewardConfig(executor="gpu"))
