"""The LLM judge against a small OpenAI-compatible server started here (starlette + uvicorn, 127.0.0.1).

The server reads the two answers from the prompt (the tests use the template `MODE {query} A {answer_a}
B {answer_b}`), prefers the longer one, and misbehaves on request: garbage replies, HTTP errors, a
flaky start, position bias, a refused API key.
"""
import asyncio
import json
import re
import socket

import pytest
from starlette.responses import JSONResponse, PlainTextResponse

from rewards.judge import Candidate, JudgeConfig, JudgeError, LLMJudge, build_judge
from tests.fakes.chat_server import ChatEndpoint, running_chat_endpoint

TEMPLATE = "MODE {query} A {answer_a} B {answer_b}"


def answer(endpoint: ChatEndpoint, mode: str, prompt: str):
    a, b = re.match(r"MODE \S+ A (.*) B (.*)", prompt, re.S).groups()
    if mode == "garbage":
        return "Both answers have merits; I cannot decide."
    if mode == "not_json":
        return PlainTextResponse("<html>bad gateway</html>")
    if mode == "error500":
        return JSONResponse({"error": "boom"}, status_code=500)
    if mode == "refused":
        return JSONResponse({"error": "invalid api key"}, status_code=401)
    if mode == "flaky" and endpoint.requests[mode] <= 2:
        return JSONResponse({"error": "overloaded"}, status_code=429)
    if mode == "biased":
        return '{"winner": "A"}'
    winner = "A" if len(a) > len(b) else "B" if len(b) > len(a) else "tie"
    if mode == "chatty":
        return f"Let me think.\n```json\n{json.dumps({'reason': 'longer', 'winner': winner})}\n```"
    return json.dumps({"score_a": len(a), "score_b": len(b), "winner": winner})


@pytest.fixture(scope="module")
def endpoint():
    with running_chat_endpoint(answer) as fake:
        yield fake


def make_judge(endpoint, **overrides) -> LLMJudge:
    cfg = JudgeConfig(type="llm", base_url=endpoint.base_url, model="fake-judge", prompt=TEMPLATE,
                      api_key_env="FAKE_JUDGE_KEY", backoff_s=0.01, max_retries=2, timeout_s=5)
    for key, value in overrides.items():
        setattr(cfg, key, value)
    return build_judge(cfg)


async def compare(judge, mode, a, b):
    try:
        return await judge.compare(mode, Candidate(a), Candidate(b))
    finally:
        await judge.aclose()


def test_both_orders_are_judged_and_cached(endpoint, monkeypatch):
    monkeypatch.setenv("FAKE_JUDGE_KEY", "sk-test")
    judge = make_judge(endpoint)
    before = endpoint.requests["ok"]

    async def run():
        first = await judge.compare("ok", Candidate("a long answer"), Candidate("short"))
        reverse = await judge.compare("ok", Candidate("short"), Candidate("a long answer"))
        tie = await judge.compare("ok", Candidate("same"), Candidate("four"))
        await judge.aclose()
        return first, reverse, tie

    assert asyncio.run(run()) == (1.0, 0.0, 0.5)
    # 2 orders for the first pair; the reversed pair is served from the cache; 2 for the tie pair.
    assert endpoint.requests["ok"] - before == 4
    assert judge.stats == {"requests": 4, "cache_hits": 2, "retries": 0}
    assert endpoint.auth[-1] == "Bearer sk-test"
    assert endpoint.bodies[-1]["model"] == "fake-judge" and endpoint.bodies[-1]["temperature"] == 0.0


def test_position_bias_cancels(endpoint):
    assert asyncio.run(compare(make_judge(endpoint), "biased", "a long answer", "short")) == 0.5


def test_verdict_inside_chatter_is_found(endpoint):
    assert asyncio.run(compare(make_judge(endpoint), "chatty", "a long answer", "short")) == 1.0


@pytest.mark.parametrize("mode, what", [("garbage", "no verdict"), ("error500", "HTTP 500"),
                                        ("not_json", "JSONDecodeError")])
def test_failures_are_retried_then_raised(endpoint, mode, what):
    before = endpoint.requests[mode]
    judge = make_judge(endpoint)
    with pytest.raises(JudgeError, match=f"failed 3 times; last: .*{what}"):
        asyncio.run(compare(judge, mode, "x", "y"))
    assert endpoint.requests[mode] - before == 2 * 3  # both orders, 1 try + 2 retries each
    assert judge.stats["retries"] == 4


def test_flaky_endpoint_recovers_with_backoff(endpoint):
    judge = make_judge(endpoint)
    assert asyncio.run(compare(judge, "flaky", "a long answer", "short")) == 1.0
    assert judge.stats["retries"] == 2


def test_refused_request_fails_at_once(endpoint):
    before = endpoint.requests["refused"]
    with pytest.raises(JudgeError, match="refused the request .*HTTP 401"):
        asyncio.run(compare(make_judge(endpoint), "refused", "x", "y"))
    assert endpoint.requests["refused"] - before <= 2  # no retries (one per order at most)


def test_unreachable_endpoint_is_a_judge_error():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there now
    judge = LLMJudge(JudgeConfig(type="llm", base_url=f"http://127.0.0.1:{port}/v1", model="m", max_retries=1,
                                 backoff_s=0.01, prompt=TEMPLATE))
    with pytest.raises(JudgeError, match="failed 2 times; last: Connect"):
        asyncio.run(compare(judge, "ok", "x", "y"))


def test_concurrency_limit(endpoint):
    judge = make_judge(endpoint, max_concurrency=3)
    endpoint.peak = 0

    async def run():
        pairs = [(Candidate("a" * (i + 1)), Candidate("b" * (i + 2))) for i in range(8)]
        out = await asyncio.gather(*(judge.compare("ok", a, b) for a, b in pairs))
        await judge.aclose()
        return out

    assert asyncio.run(run()) == [0.0] * 8
    assert endpoint.peak == 3


def test_extra_body_reaches_every_request_and_cannot_replace_the_messages(endpoint):
    schema = {"type": "json_schema", "json_schema": {"name": "verdict", "schema": {
        "type": "object", "properties": {"winner": {"enum": ["A", "B", "tie"]}}, "required": ["winner"]}}}
    judge = make_judge(endpoint, api_key_env=None, extra_body={"response_format": schema, "top_k": 1})
    seen = len(endpoint.bodies)
    assert asyncio.run(compare(judge, "ok", "extra long", "short")) == 1.0
    sent = endpoint.bodies[seen:]
    assert len(sent) == 2 and all(b["response_format"] == schema and b["top_k"] == 1 for b in sent)
    assert all(b["model"] == "fake-judge" and b["messages"][-1]["content"].startswith("MODE ok") for b in sent)
    with pytest.raises(ValueError, match=r"may not set \['messages'\]"):
        make_judge(endpoint, extra_body={"messages": []})
