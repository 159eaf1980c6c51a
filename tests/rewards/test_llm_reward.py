"""The pointwise LLM judge reward against a small OpenAI-compatible server started here.

The server reads a mode from the rubric (the tests' template starts `MODE <mode>`) and replies with a
score in some form, garbage, HTTP errors or a flaky start.
"""
import asyncio

import pytest
from starlette.responses import JSONResponse

from rewards.combine import RewardConfig
from rewards.scorer import build_scorer
from rewards.chat import ChatClient, JudgeError
from rewards.judge import render_path
from rewards.llm_reward import DEFAULT_RUBRIC, LLMReward, parse_score, render_rubric
from rl_factory.types import Trajectory, Turn
from tests.fakes.chat_server import ChatEndpoint, running_chat_endpoint

TEMPLATE = "MODE {question}\nREF {reference}\nPATH {path}\nANSWER {answer}"
REPLIES = {"json": '{"reason": "fine", "score": 7}', "fraction": 'Here: {"score": 0.7}',
           "slash": "The answer is right but terse.\nScore: 7/10", "brackets": "Rating: [[8]]",
           "garbage": "I would rather not grade this."}


def answer(endpoint: ChatEndpoint, mode: str, prompt: str):
    if mode == "error500" or (mode == "flaky" and endpoint.requests[mode] <= 2):
        return JSONResponse({"error": "boom"}, status_code=500)
    return REPLIES.get(mode, '{"score": 10}')


@pytest.fixture(scope="module")
def endpoint():
    with running_chat_endpoint(answer) as fake:
        yield fake


def make_reward(endpoint, **overrides) -> LLMReward:
    cfg = dict(model="fake-judge", base_url=endpoint.base_url, prompt=TEMPLATE, backoff_s=0.01, max_retries=2,
               timeout_s=5)
    return LLMReward(**{**cfg, **overrides})


async def score(reward, mode, completion="Paris", **kwargs):
    try:
        return await reward(prompt=mode, completion=completion, **kwargs)
    finally:
        await reward.aclose()


@pytest.mark.parametrize("reply, value", [
    ('{"reason": "ok", "score": 7}', 0.7), ('{"score": 0.7}', 0.7), ('{"score": 1.0}', 1.0),
    ('{"score": "8/10"}', 0.8), ("Score: 7/10", 0.7), ("[[8]]", 0.8), ("Rating: 4 out of 5", 0.8),
    ("Maybe a 3... no. Final score: 9", 0.9), ("score = 85/100", 0.85), ("6", 0.6), ("10/10", 1.0),
])
def test_parse_score(reply, value):
    assert parse_score(reply) == pytest.approx(value)


@pytest.mark.parametrize("reply", ["", "no idea", "Score: 12", '{"score": "high"}', "[[11/10]]", "7 apples"])
def test_parse_score_rejects_garbage(reply):
    with pytest.raises(ValueError):
        parse_score(reply)


def test_rubric_shows_question_reference_path_and_answer():
    messages = [{"role": "user", "content": "Capital of France?"},
                {"role": "assistant", "content": "Searching.", "tool_calls": [
                    {"function": {"name": "search", "arguments": {"query": "France capital"}}}]},
                {"role": "tool", "content": "SECRET TOOL OUTPUT"},
                {"role": "assistant", "content": "<answer>Paris</answer>"}]
    text = render_rubric(DEFAULT_RUBRIC, "Capital of France?", "<answer>Paris</answer>", render_path(messages),
                         ["Paris", "paris, france"])
    assert "Paris | paris, france" in text and '"score": <integer 0-10>' in text
    assert 'call search({"query": "France capital"})' in text and "SECRET TOOL OUTPUT" not in text
    assert "(none given)" in render_rubric(DEFAULT_RUBRIC, "q", "a")


@pytest.mark.parametrize("mode", ["json", "fraction", "slash"])
def test_scores_are_normalized(endpoint, mode):
    assert asyncio.run(score(make_reward(endpoint), mode)) == pytest.approx(0.7)


def test_prompt_carries_the_rollout_and_replies_are_cached(endpoint):
    reward = make_reward(endpoint)
    messages = [{"role": "user", "content": "q"},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"function": {"name": "search", "arguments": {"query": "x y"}}}]},
                {"role": "tool", "content": "hits"}, {"role": "assistant", "content": "<answer>Y</answer>"}]
    before = endpoint.requests["brackets"]

    async def run():
        first = await reward(prompt="brackets", completion="<answer>Y</answer>", answer=["Y"], messages=messages)
        again = await reward(prompt="brackets", completion="<answer>Y</answer>", answer=["Y"], messages=messages)
        await reward.aclose()
        return first, again

    assert asyncio.run(run()) == (0.8, 0.8)
    assert endpoint.requests["brackets"] - before == 1 and reward.stats["cache_hits"] == 1
    assert 'call search({"query": "x y"})' in endpoint.prompts[-1] and "REF Y" in endpoint.prompts[-1]
    assert "ANSWER <answer>Y</answer>" in endpoint.prompts[-1] and "hits" not in endpoint.prompts[-1]


@pytest.mark.parametrize("mode, what", [("garbage", "no score"), ("error500", "HTTP 500")])
def test_failures_are_retried_then_raised(endpoint, mode, what):
    before = endpoint.requests[mode]
    reward = make_reward(endpoint)
    with pytest.raises(JudgeError, match=f"failed 3 times; last: .*{what}"):
        asyncio.run(score(reward, mode))
    assert endpoint.requests[mode] - before == 3 and reward.stats["retries"] == 2


def test_flaky_endpoint_recovers(endpoint):
    reward = make_reward(endpoint)
    assert asyncio.run(score(reward, "flaky")) == 1.0 and reward.stats["retries"] == 2


def test_concurrency_limit(endpoint):
    reward = make_reward(endpoint, max_concurrency=2)
    endpoint.peak = 0

    async def run():
        out = await asyncio.gather(*(reward(prompt="ok", completion=f"answer {i}") for i in range(6)))
        await reward.aclose()
        return out

    assert asyncio.run(run()) == [1.0] * 6 and endpoint.peak == 2


def _traj(prompt: str, text: str) -> Trajectory:
    return Trajectory(sample_index=0, prompt_ids=[0], token_ids=[0, 1], loss_mask=[0, 1], logprobs=[0.0, 0.0],
                      messages=[{"role": "user", "content": prompt}, {"role": "assistant", "content": text}],
                      turns=[Turn(generated_ids=[1], logprobs=[0.0], text=text)], stop_reason="stop",
                      sample={"prompt": prompt, "answer": ["Paris"]})


def test_from_reward_functions_with_on_error(endpoint):
    kwargs = {"model": "fake-judge", "base_url": endpoint.base_url, "rubric": TEMPLATE, "backoff_s": 0.01,
              "max_retries": 1}
    entries = [{"function": "rewards.rules:exact_match", "name": "correct"},
               {"function": "rewards.llm_reward:llm_judge", "name": "judge", "weight": 0.5, "kwargs": kwargs}]
    reward = build_scorer(RewardConfig(functions=entries, on_error="zero"))
    good, bad = asyncio.run(_score_both(reward, _traj("slash", "<answer>Paris</answer>"),
                                        _traj("garbage", "<answer>Rome</answer>")))
    assert good[0] == pytest.approx(1.35) and good[1]["judge"] == pytest.approx(0.7)
    assert bad[0] == 0.0 and "no score" in bad[1]["judge/reward_error"]


async def _score_both(reward, *trajs):
    for t in trajs:
        await reward.score(t)
    return [(t.reward, t.reward_info) for t in trajs]


def test_chat_client_returns_text_and_survives_a_new_event_loop(endpoint):
    client = ChatClient(endpoint.base_url, "fake-judge", api_key_env=None, backoff_s=0.01, max_retries=1)
    messages = [{"role": "user", "content": "MODE slash"}]
    assert asyncio.run(client.chat(messages)) == REPLIES["slash"]
    # A second asyncio.run: the cache answers, and a new request gets a client bound to the new loop.
    assert asyncio.run(client.chat(messages)) == REPLIES["slash"] and client.stats["cache_hits"] == 1
    assert asyncio.run(client.chat([{"role": "user", "content": "MODE json"}])) == REPLIES["json"]
    asyncio.run(client.aclose())
    assert client.stats["requests"] == 2


def test_factory_in_a_reward_file(endpoint, tmp_path):
    path = tmp_path / "judge_reward.py"
    path.write_text("from rewards.llm_reward import make_llm_reward\n"
                    f"judge = make_llm_reward(model='fake-judge', base_url={endpoint.base_url!r}, "
                    f"prompt={TEMPLATE!r}, api_key_env=None)\n")
    reward = build_scorer(RewardConfig(function=f"{path}:judge"))
    value = asyncio.run(reward.score(_traj("brackets", "<answer>Paris</answer>")))
    assert value == pytest.approx(0.8)


def test_the_judges_api_key_is_a_secret_even_when_the_endpoint_echoes_it(tmp_path, monkeypatch):
    from rl_factory.evaluate import write_rollouts

    key = "sk-judge-" + "0123456789abcdef"
    monkeypatch.setenv("RLF_JUDGE_TEST_KEY", key)
    with running_chat_endpoint(lambda ep, mode, prompt: f"no verdict for {ep.auth[-1]}") as echo:
        kwargs = {"model": "fake-judge", "base_url": echo.base_url, "rubric": TEMPLATE, "backoff_s": 0.01,
                  "max_retries": 0, "api_key_env": "RLF_JUDGE_TEST_KEY"}
        reward = build_scorer(RewardConfig(functions=[{"function": "rewards.llm_reward:llm_judge", "name": "judge",
                                                       "kwargs": kwargs}], on_error="zero"))
        traj = _traj("echo", "<answer>Paris</answer>")
        asyncio.run(reward.score(traj))
    assert echo.auth == [f"Bearer {key}"]  # the key was sent, and the endpoint said it back
    write_rollouts(tmp_path / "step.jsonl", [traj])
    written = (tmp_path / "step.jsonl").read_text()
    assert key not in written and "${oc.env:RLF_JUDGE_TEST_KEY}" in written
