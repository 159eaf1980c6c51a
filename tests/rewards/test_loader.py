import asyncio
import textwrap
import threading

import pytest

from envs import ToolEnv
from rewards.loader import (
    REWARD_ARGS,
    RewardError,
    RewardFn,
    RewardLoadError,
    RewardTools,
    load_reward,
    reward_kwargs,
)
from rewards.scorer import score_trajectories
from rl_factory.types import ToolCall, ToolResult, Trajectory, Turn


def make_traj(completion="The answer is 42.", answer="42", sample_index=0, **columns):
    call = ToolCall(name="calculator", arguments={"expression": "6*7"})
    turns = [
        Turn(generated_ids=[1], logprobs=[-0.1], text="<tool_call>...</tool_call>",
             tool_calls=[call], tool_results=[ToolResult(call=call, text="42")]),
        Turn(generated_ids=[2], logprobs=[-0.2], text=completion),
    ]
    prompt = "What is 6 * 7?"
    sample = {"prompt": prompt, "answer": answer,
              "messages": [{"role": "user", "content": prompt}], **columns}
    return Trajectory(sample_index=sample_index, prompt_ids=[0], token_ids=[0, 1, 2],
                      loss_mask=[0, 1, 1], logprobs=[0.0, -0.1, -0.2], messages=[],
                      turns=turns, stop_reason="stop", sample=sample)


def write(path, source):
    path.write_text(textwrap.dedent(source))
    return path


def test_file_spec_absolute_and_relative(tmp_path, monkeypatch):
    write(tmp_path / "my_reward.py", """
        def reward(completion, answer):
            return float(answer in completion)
    """)
    traj = make_traj()
    fn = load_reward(f"{tmp_path / 'my_reward.py'}:reward")
    assert asyncio.run(fn.score(traj)) == (1.0, {})
    monkeypatch.chdir(tmp_path)
    assert asyncio.run(load_reward("my_reward.py:reward").score(traj)) == (1.0, {})


def test_module_spec():
    fn = load_reward("rewards.exact_match:numeric_exact_match")
    assert asyncio.run(fn.score(make_traj("so 10,063.", answer="10063"))) == (1.0, {})


def test_only_named_kwargs_are_passed():
    seen = {}

    def reward(completion, tool_calls, num_turns, difficulty):
        seen.update(completion=completion, tool_calls=tool_calls, num_turns=num_turns,
                    difficulty=difficulty)
        return 1

    asyncio.run(RewardFn(reward).score(make_traj(difficulty="hard")))
    assert seen == {"completion": "The answer is 42.",
                    "tool_calls": [{"name": "calculator", "arguments": {"expression": "6*7"},
                                    "error": None}],
                    "num_turns": 2, "difficulty": "hard"}


def test_var_kwargs_gets_everything():
    seen = {}

    def reward(**kwargs):
        seen.update(kwargs)
        return 0.5

    asyncio.run(RewardFn(reward).score(make_traj(difficulty="hard")))
    assert set(REWARD_ARGS) | {"difficulty"} <= set(seen)
    assert seen["prompt"] == "What is 6 * 7?"
    assert seen["tool_results"] == [{"name": "calculator", "text": "42", "ok": True,
                                     "error_kind": None}]


def test_reward_kwargs_standard_names_win_over_columns():
    available = reward_kwargs(make_traj())
    assert available["prompt"] == "What is 6 * 7?"
    assert available["messages"] == []  # the trajectory's conversation, not the row's prompt


def test_async_function_and_dict_return():
    async def reward(completion, answer):
        await asyncio.sleep(0)
        return {"score": 0.25, "format": 1.0}

    trajs = [make_traj(sample_index=i) for i in range(3)]
    asyncio.run(score_trajectories(RewardFn(reward), trajs))
    assert [t.reward for t in trajs] == [0.25] * 3
    assert trajs[0].reward_info == {"format": 1.0}


def test_none_scores_zero_and_is_counted():
    fn = RewardFn(lambda completion: None if "skip" in completion else 1.0)
    trajs = [make_traj("skip"), make_traj("ok"), make_traj("skip")]
    metrics = asyncio.run(score_trajectories(fn, trajs))
    assert [t.reward for t in trajs] == [0.0, 1.0, 0.0]
    assert metrics == {"reward/none_count": 2.0, "reward/errors": 0.0}
    assert fn.num_none == 2


def test_run_in_thread_runs_sync_function_off_the_loop():
    threads = []

    def reward(completion):
        threads.append(threading.get_ident())
        return 1.0

    asyncio.run(score_trajectories(RewardFn(reward, run_in_thread=True), [make_traj()]))
    assert threads and threads[0] != threading.get_ident()


def test_raising_function_names_sample_and_prompt():
    def reward(completion):
        raise ZeroDivisionError("oops")

    with pytest.raises(RewardError) as err:
        asyncio.run(score_trajectories(RewardFn(reward), [make_traj(sample_index=7)]))
    assert "sample 7" in str(err.value) and "What is 6 * 7?" in str(err.value)
    assert isinstance(err.value.__cause__, ZeroDivisionError)


def test_bad_return_values():
    for value, match in [({"format": 1}, "without a 'score'"), ("high", "expected a real number"),
                         (float("nan"), "non-finite")]:
        with pytest.raises(RewardError, match=match):
            asyncio.run(score_trajectories(RewardFn(lambda v=value: v), [make_traj()]))


def test_missing_argument_names_it():
    with pytest.raises(RewardError, match="needs \\['rubric'\\]"):
        asyncio.run(score_trajectories(RewardFn(lambda rubric: 1.0), [make_traj()]))


def test_load_errors(tmp_path):
    with pytest.raises(RewardLoadError, match="reward file not found: .*nope.py"):
        load_reward(f"{tmp_path}/nope.py:reward")
    write(tmp_path / "broken.py", "raise RuntimeError('boom at import')\n")
    with pytest.raises(RewardLoadError, match="boom at import") as err:
        load_reward(f"{tmp_path}/broken.py:reward")
    assert isinstance(err.value.__cause__, RuntimeError)
    write(tmp_path / "other.py", "def score(x): ...\ndef helper(): ...\nLIMIT = 3\n")
    with pytest.raises(RewardLoadError, match=r"'reward' not found .*\['helper', 'score'\]"):
        load_reward(f"{tmp_path}/other.py:reward")
    with pytest.raises(RewardLoadError, match="must look like"):
        load_reward("my_reward.py")
    with pytest.raises(RewardLoadError, match="not found"):
        load_reward("no_such_pkg_xyz.rewards:reward")
    assert isinstance(RewardLoadError("x"), ValueError)


# ---- the arguments added for tool-using tasks ------------------------------------------------

def test_turns_data_source_and_extra_info():
    seen = {}

    def reward(turns, data_source, extra_info):
        seen.update(turns=turns, data_source=data_source, extra_info=extra_info)
        return 1.0

    fn = RewardFn(reward)
    asyncio.run(fn.score(make_traj(data_source="gsm8k", extra_info={"split": "train", "index": 3})))
    assert seen["data_source"] == "gsm8k" and seen["extra_info"] == {"split": "train", "index": 3}
    assert seen["turns"] == [
        {"text": "<tool_call>...</tool_call>", "num_tokens": 1,
         "tool_calls": [{"name": "calculator", "arguments": {"expression": "6*7"}, "error": None}],
         "tool_results": [{"name": "calculator", "text": "42", "ok": True, "error_kind": None}]},
        {"text": "The answer is 42.", "num_tokens": 1, "tool_calls": [], "tool_results": []},
    ]
    asyncio.run(fn.score(make_traj()))  # a dataset without those columns: None, not an error
    assert seen["data_source"] is None and seen["extra_info"] is None


def test_bound_arguments_win_and_are_checked():
    fn = RewardFn(lambda completion, limit: float(len(completion) <= limit), bound={"limit": 5})
    assert asyncio.run(fn.score(make_traj("short", limit=1000))) == (1.0, {})  # not the column
    with pytest.raises(RewardLoadError, match="no parameter 'limt'.*\\['completion', 'limit'\\]"):
        RewardFn(lambda completion, limit: 0.0, bound={"limt": 5})
    fn = load_reward("rewards.exact_match:numeric_exact_match", bound={"answer": "7"})
    assert asyncio.run(fn.score(make_traj("it is 7"))) == (1.0, {})


SQL_TOOL = '''
import sqlite3

DB = sqlite3.connect(":memory:", check_same_thread=False)
DB.executescript("CREATE TABLE t (city TEXT, pop INT);"
                 "INSERT INTO t VALUES ('Oslo', 700), ('Bergen', 290);")


def run_sql(query: str) -> str:
    """Run a SQL query and return the rows, one per line."""
    return "\\n".join(",".join(map(str, row)) for row in DB.execute(query).fetchall())
'''

SQL_REWARD = '''
async def reward(completion, answer, tools):
    result = await tools.call("run_sql", {"query": completion})
    return float(result.ok and result.text == answer)
'''


def test_tools_handle_verifies_by_calling_a_tool(tmp_path):
    write(tmp_path / "sql_tools.py", SQL_TOOL)
    write(tmp_path / "sql_reward.py", SQL_REWARD)
    fn = load_reward(f"{tmp_path / 'sql_reward.py'}:reward")
    trajs = [make_traj("SELECT pop FROM t WHERE city = 'Oslo'", answer="700"),
             make_traj("SELECT pop FROM t WHERE city = 'Bergen'", answer="700"),
             make_traj("SELEC nonsense", answer="700")]

    async def main():
        async with ToolEnv.from_manifest({"functions": [f"{tmp_path / 'sql_tools.py'}:run_sql"]}) as env:
            await env.list_tools()
            await score_trajectories(fn, trajs, tools=env)
            return env.metrics()

    env_metrics = asyncio.run(main())
    assert [t.reward for t in trajs] == [1.0, 0.0, 0.0]  # the bad SQL is a failed result, not a crash
    assert env_metrics["tool/calls"] == 0  # the agent's tool metrics do not count the reward's calls


def test_tools_without_an_env_is_a_clear_error():
    async def reward(tools):
        return (await tools.call("run_sql", {"query": "SELECT 1"})).text

    with pytest.raises(RewardError, match="no tool env was given"):
        asyncio.run(score_trajectories(RewardFn(reward), [make_traj()]))
    assert RewardTools().names == []
