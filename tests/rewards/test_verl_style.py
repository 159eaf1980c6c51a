"""Rewards with verl's signature, compute_score(data_source, solution_str, ground_truth, extra_info=None, **kw):
called with verl's arguments on the embedded scorer and in verl's reward worker alike."""
import asyncio
import json

import pytest

from rewards.combine import RewardConfig
from rewards.loader import RewardLoadError, load_reward
from rewards.scorer import build_scorer, reward_info_metrics, score_trajectories
from rl_factory.evaluate import summarize
from rl_factory.types import ToolCall, ToolResult, Trajectory, Turn
from tests.compat_fixtures import DATA_SOURCE, VERL_REWARD, verl_rows

ROW = {**verl_rows([(15, "*", 27)])[0], "answer": "405", "messages": [{"role": "user", "content": "What is 15 * 27?"}]}


def traj(final: str, sample=ROW) -> Trajectory:
    call = ToolCall(name="calculator", arguments={"expression": "15 * 27"}, raw="{}")
    first = Turn([1], [-0.1], '<tool_call>\n{"name": "calculator"}\n</tool_call>', tool_calls=[call],
                 tool_results=[ToolResult(call=call, text="405")])
    return Trajectory(sample_index=0, prompt_ids=[0], token_ids=[0, 1, 2], loss_mask=[0, 1, 1], logprobs=[0.0] * 3,
                      messages=list(sample["messages"]), turns=[first, Turn([2], [-0.2], final)],
                      stop_reason="answer", sample=sample)


def test_a_verl_signature_gets_verls_arguments_by_name(tmp_path, monkeypatch):
    log = tmp_path / "calls.jsonl"
    monkeypatch.setenv("VERL_REWARD_LOG", str(log))
    trajs = [traj("The answer is 405."), traj("It is 400.")]
    asyncio.run(score_trajectories(load_reward(f"{VERL_REWARD}:compute_score"), trajs))
    [first, second] = [json.loads(line) for line in log.read_text().splitlines()]
    assert first == {"data_source": DATA_SOURCE, "solution_str": "The answer is 405.", "ground_truth": "405",
                     "extra_info": {"split": "train", "index": 0, "question": "15 * 27"}, "kwargs": []}
    assert second["solution_str"] == "It is 400."
    assert [t.reward for t in trajs] == [1.0, 0.0]
    assert trajs[0].reward_info == {"acc": 1.0, "pred": "405"}  # verl's dict: the keys beside "score"
    metrics = summarize(trajs)  # what both backends log for a step, from its rollouts
    assert metrics["reward/acc/mean"] == 0.5 and "reward/pred/mean" not in metrics  # numbers only


def test_extra_info_is_a_dict_and_kwargs_get_only_verls_arguments():
    seen = {}

    def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
        seen.update(extra_info=extra_info, kwargs=sorted(kwargs))
        return 0.0

    bare = {"prompt": "q", "answer": "1", "messages": [{"role": "user", "content": "q"}]}  # no verl columns
    asyncio.run(score_trajectories(load_reward(compute_score), [traj("1", bare)]))
    assert seen == {"extra_info": {}, "kwargs": []}  # verl passes {} for a row without extra_info, nothing else
    fixed = load_reward(compute_score, bound={"format_score": 0.1})  # the config's kwargs still arrive
    asyncio.run(score_trajectories(fixed, [traj("1", bare)]))
    assert seen["kwargs"] == ["format_score"]


def test_the_transcript_switch_gives_solution_str_the_whole_rollout():
    fn = load_reward(f"{VERL_REWARD}:count_tool_responses")
    assert fn.verl.solution_str == "transcript"
    [t] = trajs = [traj("done")]
    asyncio.run(score_trajectories(fn, trajs))
    assert t.reward == 1.0  # the one tool result, seen in the transcript

    def without_switch(data_source, solution_str, ground_truth, extra_info=None):
        return float(solution_str.count("<tool_response>"))

    trajs = [traj("done")]
    asyncio.run(score_trajectories(load_reward(without_switch), trajs))
    assert trajs[0].reward == 0.0  # the default solution_str is the final completion


def test_a_bad_switch_value_is_named_at_load():
    def compute_score(data_source, solution_str, ground_truth, extra_info=None):
        return 0.0

    compute_score.solution_str = "everything"
    with pytest.raises(RewardLoadError, match=r"compute_score: its attribute solution_str = 'everything' must be "
                                              r"one of \['completion', 'transcript'\]"):
        load_reward(compute_score)


def test_verls_reward_worker_scores_it_the_same(tmp_path, monkeypatch):
    pytest.importorskip("verl", reason="verl is an extra: bash setup.sh --dev (verl-cpu)")
    from rl_factory.backends.verl.records import RECORD_KEY, to_record
    from rl_factory.backends.verl.reward import compute_score

    log = tmp_path / "calls.jsonl"
    monkeypatch.setenv("VERL_REWARD_LOG", str(log))
    settings = {"reward": {"function": f"{VERL_REWARD}:compute_score"}, "tools": None}
    embedded = [traj("405, surely")]
    asyncio.run(score_trajectories(build_scorer(RewardConfig(function=f"{VERL_REWARD}:compute_score")), embedded))
    # What verl's RewardLoopWorker calls: our adapter, with the agent loop's record in extra_info.
    result = asyncio.run(compute_score(DATA_SOURCE, "ignored: the record is scored", "405",
                                       {RECORD_KEY: to_record(traj("405, surely"))}, rl_factory=settings))
    assert result["score"] == embedded[0].reward == 1.0 and result["reward/acc"] == 1.0
    # verl's reward_extra_info form is logged under the same names as the embedded reward_info
    assert reward_info_metrics([result]) == reward_info_metrics([embedded[0].reward_info]) == {"reward/acc/mean": 1.0}
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    assert calls[0] == calls[1]  # the user's function saw the same arguments on both backends
