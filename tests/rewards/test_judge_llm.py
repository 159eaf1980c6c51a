"""The LLM judge against a small OpenAI-compatible server started here (starlette + uvicorn, 127.0.0.1).

The server reads the two answers from the prompt (the tests use the template `MODE {query} A {answer_a}
B {answer_b}`), prefers the longer one, and misbehaves on request: garbage replies, HTTP errors, a
flaky start, position bias, a refused API key.
"""
import asyncio
import json
import re
import socket
import threading
import time
from collections import Counter

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse
from starlette.routing import Route

from rewards.judge import Candidate, JudgeConfig, JudgeError, LLMJudge, build_judge

TEMPLATE = "MODE {query} A {answer_a} B {answer_b}"


class FakeEndpoint:
    def __init__(self):
        self.requests = Counter()  # by mode
        self.in_flight = self.peak = 0
        self.auth: list[str] = []
        self.bodies: list[dict] = []

    def reply(self, content: str) -> JSONResponse:
        return JSONResponse({"id": "x", "object": "chat.completion",
                             "choices": [{"index": 0, "message": {"role": "assistant", "content": content}}]})

    async def chat(self, request: Request):
        body = await request.json()
        self.bodies.append(body)
        self.auth.append(request.headers.get("authorization", ""))
        mode, a, b = re.match(r"MODE (\S+) A (.*) B (.*)", body["messages"][-1]["content"], re.S).groups()
        self.requests[mode] += 1
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        try:
            await asyncio.sleep(0.02)
            return self.answer(mode, a, b)
        finally:
            self.in_flight -= 1

    def answer(self, mode, a, b):
        if mode == "garbage":
            return self.reply("Both answers have merits; I cannot decide.")
        if mode == "not_json":
            return PlainTextResponse("<html>bad gateway</html>")
        if mode == "error500":
            return JSONResponse({"error": "boom"}, status_code=500)
        if mode == "refused":
            return JSONResponse({"error": "invalid api key"}, status_code=401)
        if mode == "flaky" and self.requests[mode] <= 2:
            return JSONResponse({"error": "overloaded"}, status_code=429)
        if mode == "biased":
            return self.reply('{"winner": "A"}')
        winner = "A" if len(a) > len(b) else "B" if len(b) > len(a) else "tie"
        if mode == "chatty":
            return self.reply(f"Let me think.\n```json\n{json.dumps({'reason': 'longer', 'winner': winner})}\n```")
        return self.reply(json.dumps({"score_a": len(a), "score_b": len(b), "winner": winner}))


@pytest.fixture(scope="module")
def endpoint():
    fake = FakeEndpoint()
    app = Starlette(routes=[Route("/v1/chat/completions", fake.chat, methods=["POST"])])
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.01)
    fake.base_url = f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
    yield fake
    server.should_exit = True
    thread.join(timeout=5)
    sock.close()


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
