"""Scoring while rollouts run, the error policy (raise / zero), timeouts, and the three executors."""
import asyncio
import os
import textwrap
import time

import pytest

from rewards.combine import Component, RewardConfig
from rewards.executors import RewardTimeout
from rewards.loader import RewardError, RewardFn, RewardLoadError
from rewards.scorer import Scorer, build_scorer, score_trajectories
from rl_factory.types import Trajectory, Turn


def make_traj(completion="42", sample_index=0, **columns):
    sample = {"prompt": f"question {sample_index}", "answer": "42", **columns}
    return Trajectory(sample_index=sample_index, prompt_ids=[0], token_ids=[0, 1], loss_mask=[0, 1],
                      logprobs=[0.0, -0.1], messages=[], turns=[Turn([1], [-0.1], completion)],
                      stop_reason="answer", sample=sample)


def write_rewards(tmp_path, source):
    path = tmp_path / "slow_rewards.py"
    path.write_text(textwrap.dedent(source))
    return path


def test_finished_trajectories_are_scored_while_others_still_roll_out():
    events = []

    async def reward(completion, sample):
        events.append(("scored", sample["prompt"]))
        return 1.0

    async def main():
        scorer = Scorer.wrap(RewardFn(reward))

        async def rollout(i, seconds):  # what Agent.rollout_groups(on_done=scorer.submit) does
            await asyncio.sleep(seconds)
            traj = make_traj(sample_index=i)
            events.append(("finished", traj.sample["prompt"]))
            scorer.submit(traj)
            return traj

        trajs = await asyncio.gather(rollout(0, 0.0), rollout(1, 0.3))
        return trajs, await scorer.wait(trajs)

    trajs, metrics = asyncio.run(main())
    assert events.index(("scored", "question 0")) < events.index(("finished", "question 1"))
    assert [t.reward for t in trajs] == [1.0, 1.0] and metrics["reward/errors"] == 0.0


def test_a_raising_reward_names_the_first_sample_in_batch_order():
    async def reward(completion, answer, sample):
        # The later trajectory fails first; the error still names the earlier one.
        await asyncio.sleep(0.05 if sample["id"] == "row-3" else 0.0)
        raise ZeroDivisionError(f"bad row {sample['id']}")

    trajs = [make_traj("The answer is " + "x" * 500, sample_index=3, id="row-3"), make_traj(sample_index=5, id="row-5")]
    with pytest.raises(RewardError) as err:
        asyncio.run(score_trajectories(RewardFn(reward, name="my_reward.py:reward"), trajs))
    message = str(err.value)
    assert message.startswith("reward my_reward.py:reward failed on sample 3 (id 'row-3') (prompt: 'question 3')")
    assert "ZeroDivisionError: bad row row-3" in message
    assert "inputs: completion='The answer is xxx" in message and "answer='42'" in message
    assert "\n" not in message and len(message) < 400
    assert isinstance(err.value.__cause__, ZeroDivisionError)


def test_on_error_zero_scores_the_failing_component_zero_and_counts_it(tmp_path):
    path = write_rewards(tmp_path, """
        def picky(completion):
            if completion == "boom":
                raise ValueError("cannot score " + completion)
            return 1.0

        def always(completion):
            return 1.0
    """)
    reward = build_scorer(RewardConfig(on_error="zero", functions=[
        {"function": f"{path}:picky", "weight": 2.0}, {"function": f"{path}:always", "weight": 0.5}]))
    trajs = [make_traj("boom"), make_traj("fine")]
    metrics = asyncio.run(score_trajectories(reward, trajs))
    assert [t.reward for t in trajs] == [0.5, 2.5]
    assert trajs[0].reward_info == {"picky": 0.0, "picky/reward_error": "ValueError: cannot score boom", "always": 1.0}
    assert metrics["reward/errors"] == 1.0 and metrics["reward/picky/mean"] == 0.5


def test_timeouts_count_as_errors_on_every_executor(tmp_path):
    path = write_rewards(tmp_path, """
        import asyncio
        import time

        async def waits(completion):
            await asyncio.sleep(5)

        def sleeps(completion):
            time.sleep(0.3)
            return 1.0
    """)
    for function, executor in [("waits", "inline"), ("sleeps", "thread"), ("sleeps", "inline")]:
        reward = build_scorer(RewardConfig(function=f"{path}:{function}", executor=executor, timeout_s=0.1))
        start = time.perf_counter()
        with pytest.raises(RewardError, match="RewardTimeout: .*reward.timeout_s") as err:
            asyncio.run(score_trajectories(reward, [make_traj()]))
        assert isinstance(err.value.__cause__, RewardTimeout)
        assert time.perf_counter() - start < 2, (function, executor)
        zero = build_scorer(RewardConfig(function=f"{path}:{function}", executor=executor, timeout_s=0.1,
                                         on_error="zero"))
        traj = make_traj()
        assert asyncio.run(score_trajectories(zero, [traj]))["reward/errors"] == 1.0 and traj.reward == 0.0


def test_a_timeout_error_the_reward_raises_itself_is_not_called_a_timeout():
    async def reward(completion):
        raise TimeoutError("the grader's own deadline")

    reward_fn = Scorer([Component("grader", RewardFn(reward))], timeout_s=5.0)
    with pytest.raises(RewardError, match="failed on sample 0 .*: TimeoutError: the grader's own deadline"):
        asyncio.run(score_trajectories(reward_fn, [make_traj()]))


PROCESS_REWARDS = """
import os
import time


def pid(completion):
    return {"score": 1.0, "pid": os.getpid()}


def hangs(completion):
    if completion == "hang":
        time.sleep(60)
    return 1.0


def needs_tools(completion, tools):
    return 1.0
"""


def test_process_executor_runs_elsewhere_and_kills_a_timed_out_worker(tmp_path):
    path = write_rewards(tmp_path, PROCESS_REWARDS)
    reward = build_scorer(RewardConfig(executor="process", timeout_s=3.0, on_error="zero", max_concurrency=2,
                                       functions=[f"{path}:pid", f"{path}:hangs"]))
    try:
        trajs = [make_traj("hang", sample_index=0), make_traj("fine", sample_index=1)]
        start = time.perf_counter()
        metrics = asyncio.run(score_trajectories(reward, trajs))
        assert time.perf_counter() - start < 30  # not the 60 s the hung call would take
        assert metrics["reward/errors"] == 1.0
        assert "RewardTimeout" in trajs[0].reward_info["hangs/reward_error"]
        assert trajs[1].reward == 2.0  # the other trajectory's calls are unaffected
        assert trajs[1].reward_info["pid/pid"] != os.getpid()
        again = [make_traj("fine")]
        asyncio.run(score_trajectories(reward, again))  # the pool was restarted
        assert again[0].reward == 2.0
    finally:
        reward.close()
    with pytest.raises(RewardLoadError, match="names `tools`.*reward.executor=thread"):
        build_scorer(RewardConfig(function=f"{path}:needs_tools", executor="process"))
