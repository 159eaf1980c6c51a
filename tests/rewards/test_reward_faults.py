"""A reward (or a judge) cannot take the run down: SystemExit, crashed workers, stray children, wrong
types, and judge endpoints that drip, corrupt or flood."""
import asyncio
import os
import textwrap
import time

import pytest

from rewards.chat import ChatClient, JudgeError
from rewards.combine import RewardConfig
from rewards.judge import Candidate, JudgeConfig, LLMJudge
from rewards.loader import RewardError
from rewards.scorer import build_scorer, score_trajectories
from rl_factory.algorithms.arena import run_tournament
from rl_factory.types import Trajectory, Turn
from tests.fakes.hostile_http import hostile_server

REWARDS = '''
import argparse
import ctypes
import os
import subprocess
import sys
import time


def argparse_exit(completion):
    parser = argparse.ArgumentParser(prog="grader")
    parser.add_argument("--strict", action="store_true")
    parser.parse_args(completion.split())  # "--bogus" -> sys.exit(2)
    return 1.0


def calls_exit(completion):
    if completion == "exit":
        exit(0)
    return 1.0


async def async_exit(completion):
    if completion == "exit":
        raise SystemExit("bye")
    return 1.0


def crashy(completion):
    time.sleep(0.5)  # long enough for the neighbours to be running when the crash comes
    if completion == "segfault":
        ctypes.string_at(0)
    if completion == "os_exit":
        os._exit(3)
    return 1.0


def spawns_and_hangs(completion, pid_file):
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    open(pid_file, "w").write(str(child.pid))
    time.sleep(120)
    return 1.0


def as_string(completion):
    return "0.9"


def as_bool(completion):
    return True


def huge(completion):
    return float(completion)


def leaks_key(completion, key):
    raise RuntimeError("x" * 176 + key)  # the key straddles the 200th character of the kept error
'''


def make_traj(completion="fine", sample_index=0, **columns):
    sample = {"prompt": f"question {sample_index}", "answer": "42", **columns}
    return Trajectory(sample_index=sample_index, prompt_ids=[0], token_ids=[0, 1], loss_mask=[0, 1],
                      logprobs=[0.0, -0.1], messages=[], turns=[Turn([1], [-0.1], completion)],
                      stop_reason="answer", sample=sample)


@pytest.fixture
def rewards_file(tmp_path):
    path = tmp_path / "faulty_rewards.py"
    path.write_text(textwrap.dedent(REWARDS))
    return path


@pytest.mark.parametrize("function, executor", [("argparse_exit", "inline"), ("calls_exit", "inline"),
                                                ("calls_exit", "thread"), ("async_exit", "inline"),
                                                ("calls_exit", "process")])
def test_system_exit_in_a_reward_is_an_error_not_the_end_of_the_run(rewards_file, function, executor):
    completion, fine = ("--bogus", "--strict") if function == "argparse_exit" else ("exit", "fine")
    scorer = build_scorer(RewardConfig(function=f"{rewards_file}:{function}", executor=executor, on_error="zero"))
    try:
        trajs = [make_traj(completion), make_traj(fine, 1)]
        metrics = asyncio.run(score_trajectories(scorer, trajs))
        assert [t.reward for t in trajs] == [0.0, 1.0] and metrics["reward/errors"] == 1.0
        assert "SystemExit" in trajs[0].reward_info["reward_error"]
        strict = build_scorer(RewardConfig(function=f"{rewards_file}:{function}", executor=executor))
        with pytest.raises(RewardError, match="failed on sample 0 .*SystemExit"):
            asyncio.run(score_trajectories(strict, [make_traj(completion)]))
        strict.close()
    finally:
        scorer.close()


@pytest.mark.parametrize("crash", ["os_exit", "segfault"])
def test_a_crashed_worker_fails_only_its_own_call(rewards_file, crash):
    scorer = build_scorer(RewardConfig(function=f"{rewards_file}:crashy", executor="process", on_error="zero",
                                       max_concurrency=2))
    try:
        trajs = [make_traj(crash, 0)] + [make_traj("fine", i) for i in range(1, 6)]
        metrics = asyncio.run(score_trajectories(scorer, trajs))
        assert [t.reward for t in trajs] == [0.0] + [1.0] * 5  # the neighbours scored normally
        assert metrics["reward/errors"] == 1.0 and "worker process died" in trajs[0].reward_info["reward_error"]
    finally:
        scorer.close()


def test_a_timed_out_reward_takes_its_whole_process_group(rewards_file, tmp_path):
    pid_file = tmp_path / "child.pid"
    scorer = build_scorer(RewardConfig(function=f"{rewards_file}:spawns_and_hangs", executor="process",
                                       timeout_s=5, on_error="zero"))
    try:
        traj = make_traj(pid_file=str(pid_file))
        start = time.perf_counter()
        asyncio.run(score_trajectories(scorer, [traj]))
        assert time.perf_counter() - start < 60 and "RewardTimeout" in traj.reward_info["reward_error"]
        child = int(pid_file.read_text())
        for _ in range(100):
            if not os.path.exists(f"/proc/{child}") or open(f"/proc/{child}/stat").read().split()[2] == "Z":
                break
            time.sleep(0.05)
        else:
            pytest.fail(f"the reward's child process {child} outlived its timed-out call")
    finally:
        scorer.close()


@pytest.mark.parametrize("function, shown", [("as_string", "str '0.9'"), ("as_bool", "bool True")])
def test_a_reward_must_return_a_real_number(rewards_file, function, shown):
    with pytest.raises(RewardError, match=f"reward returned {shown}; expected a real number"):
        asyncio.run(score_trajectories(build_scorer(RewardConfig(function=f"{rewards_file}:{function}")),
                                       [make_traj()]))


@pytest.mark.parametrize("value", ["1e308", "-1e155", "1000000.5"])
def test_a_reward_outside_the_bound_is_the_one_line_reward_error(rewards_file, value):
    scorer = build_scorer(RewardConfig(function=f"{rewards_file}:huge"))
    trajs = [make_traj("1.0", 0), make_traj(value, 1, id="row-7")]
    with pytest.raises(RewardError, match=r"^reward faulty_rewards.py:huge failed on sample 1 \(id 'row-7'\) .*"
                                          r"RewardError: reward returned .*, outside \[-1e\+06, 1e\+06\] "
                                          r"\(reward.max_abs\)") as info:
        asyncio.run(score_trajectories(scorer, trajs))
    assert "\n" not in str(info.value)
    zero = build_scorer(RewardConfig(function=f"{rewards_file}:huge", on_error="zero", max_abs=10.0))
    trajs = [make_traj("10", 0), make_traj("-11", 1)]
    metrics = asyncio.run(score_trajectories(zero, trajs))
    assert [t.reward for t in trajs] == [10.0, 0.0] and metrics["reward/errors"] == 1.0
    unbounded = build_scorer(RewardConfig(function=f"{rewards_file}:huge", max_abs=None))
    asyncio.run(score_trajectories(unbounded, trajs := [make_traj("1e300", 0)]))
    assert trajs[0].reward == 1e300


def test_a_reward_error_is_scrubbed_before_it_is_cut(rewards_file):
    from rl_factory.base.secrets import protect

    key = "sk-judge-" + "f00dcafe" * 4
    protect([key])
    scorer = build_scorer(RewardConfig(function=f"{rewards_file}:leaks_key", on_error="zero"))
    asyncio.run(score_trajectories(scorer, trajs := [make_traj(key=key)]))
    error = trajs[0].reward_info["reward_error"]
    assert error == "RuntimeError: " + "x" * 176 + "***" and key[:6] not in error


# ---- judge endpoints --------------------------------------------------------------------------


@pytest.mark.parametrize("behaviour", ["drip", "bad_gzip", "huge"])
def test_a_hostile_judge_endpoint_fails_within_its_deadline_and_byte_cap(behaviour):
    with hostile_server(behaviour) as server:
        client = ChatClient(server.url + "/v1", "judge", api_key_env=None, max_retries=1, backoff_s=0.01,
                            timeout_s=2.0, max_response_bytes=1 << 20)

        async def ask():
            start = time.perf_counter()
            with pytest.raises(JudgeError) as info:
                await asyncio.wait_for(client.chat([{"role": "user", "content": "hi"}]), 60)  # 60: a hang fails
            await client.aclose()
            return time.perf_counter() - start, str(info.value)

        seconds, message = asyncio.run(ask())
    assert seconds < 10 and "failed 2 times" in message
    assert server.bytes_sent < 16 << 20  # the 300 MB body was not read to the end


def test_judge_transport_failures_go_to_on_judge_failure():
    with hostile_server("bad_gzip") as server:
        judge = LLMJudge(JudgeConfig(type="llm", base_url=server.url + "/v1", model="judge", api_key_env=None,
                                     max_retries=0, timeout_s=2.0))
        candidates = [Candidate(answer=str(i)) for i in range(3)]

        async def play():
            try:
                return await run_tournament("round_robin", 3, lambda i, j: judge.compare("q", candidates[i],
                                                                                        candidates[j]),
                                            on_judge_failure="tie")
            finally:
                await judge.aclose()

        result = asyncio.run(play())
    assert result.failures == 3 and all(m.failed for m in result.matches)


def test_the_verl_reward_worker_goes_through_the_same_scorer(rewards_file, tmp_path):
    """verl's reward workers call `compute_score`: the run's executor, types, on_error and timeout apply."""
    from rl_factory.backends.verl.records import RECORD_KEY, to_record
    from rl_factory.backends.verl.reward import compute_score

    per_turn = tmp_path / "per_turn.py"
    per_turn.write_text("import time\ndef slow(text):\n    time.sleep(5)\n    return 1.0\n")

    def score(function, completion, **reward):
        settings = {"reward": {"function": f"{rewards_file}:{function}", "on_error": "zero", "executor": "thread",
                               **reward}, "tools": None}
        return asyncio.run(compute_score("x", "ignored", "42", extra_info={
            RECORD_KEY: to_record(make_traj(completion)), "index": 0}, rl_factory=settings))

    assert score("calls_exit", "fine")["score"] == 1.0
    assert score("calls_exit", "exit")["score"] == 0.0  # SystemExit: a reward error, not a dead worker
    assert score("as_string", "fine")["score"] == 0.0  # "0.9" is not a score
    assert score("huge", "1e308")["score"] == 0.0 and score("huge", "1e308", max_abs=None)["score"] == 1e308
    # the per-turn process reward runs under reward.timeout_s too (it used to wait however long it took)
    slow = score("calls_exit", "fine", timeout_s=0.2, process={"function": f"{per_turn}:slow"})
    assert slow["score"] == 1.0 and slow["reward/process/errors"] == 1.0
