"""The openai engine returns exactly the server's sampled ids and log-probs, and survives a flaky
server: tested against a real local HTTP server (tests/engines/conftest.py), not a mocked client."""
import asyncio

import pytest

from rl_factory.engines import ENGINES, SamplingParams
from rl_factory.engines.openai import OpenAIEngine, OpenAIEngineError

pytestmark = pytest.mark.anyio

EOS = 2
PARAMS = SamplingParams(temperature=0.7, top_p=0.9, max_new_tokens=16)


def make_engine(server, **kwargs) -> OpenAIEngine:
    options = {"model": "m", "eos_token_id": EOS, "backoff_s": 0.01, "timeout_s": 5.0, **kwargs}
    return OpenAIEngine(server.base_url, **options)


async def test_registered_as_openai():
    assert ENGINES["openai"] is OpenAIEngine


async def test_sends_token_ids_and_returns_exactly_the_servers_ids_and_logprobs(fake_server, completion,
                                                                               monkeypatch):
    monkeypatch.setenv("TEST_LLM_KEY", "sk-test")
    ids, logprobs = [901, 17, 4, 55, EOS], [-0.1, -2.25, -0.5, -3.0, -0.01]
    fake_server.replies.append(completion(ids, logprobs))
    engine = make_engine(fake_server, api_key_env="TEST_LLM_KEY")
    try:
        gen = await engine.generate([5, 6, 7], PARAMS)
    finally:
        await engine.close()
    assert (gen.token_ids, gen.logprobs, gen.finish_reason) == (ids, logprobs, "stop")
    (body,) = fake_server.requests
    assert body["prompt"] == [5, 6, 7] and body["model"] == "m"
    assert (body["max_tokens"], body["temperature"], body["top_p"]) == (16, 0.7, 0.9)
    assert body["logprobs"] == 1 and body["return_tokens_as_token_ids"] is True
    assert fake_server.headers[0]["authorization"] == "Bearer sk-test"
    assert engine.stats == {"requests": 1, "retries": 0, "eos_appended": 0}


async def test_reads_ids_from_logprob_tokens_and_refuses_token_text(fake_server, completion):
    fake_server.replies += [completion([3, 4, EOS], [-1.0, -2.0, -3.0], with_token_ids=False),
                            completion([3, 4], [-1.0, -2.0], with_token_ids=False, tokens=["a", "b"]),
                            completion([3, 4], [-1.0, -2.0], tokens=["token_id:3", "token_id:9"])]
    engine = make_engine(fake_server)
    try:
        gen = await engine.generate([1], PARAMS)
        assert gen.token_ids == [3, 4, EOS] and gen.logprobs == [-1.0, -2.0, -3.0]
        with pytest.raises(OpenAIEngineError, match="token text, not token ids"):
            await engine.generate([1], PARAMS)
        with pytest.raises(OpenAIEngineError, match="disagree"):
            await engine.generate([1], PARAMS)
    finally:
        await engine.close()


async def test_length_and_an_omitted_eos(fake_server, completion):
    fake_server.replies += [
        completion([7, 8, 9], [-0.5, -0.5, -0.5], finish="length"),  # cut: nothing appended
        completion([7, 8], [-0.5, -0.25]),  # stopped on eos but left it out: appended, log-prob 0
        completion([7, 42], [-0.5, -0.25], stop_reason=42),  # stopped on another stop token, included
        completion([7], [-0.5], stop_reason=42),  # ... and left out: the one it names is appended
        completion([7, 8], [-0.5, -0.25], stop_reason="</answer>"),  # a stop string: no single id
    ]
    engine = make_engine(fake_server)
    try:
        gens = [await engine.generate([1], PARAMS) for _ in range(5)]
    finally:
        await engine.close()
    assert [(g.token_ids, g.finish_reason) for g in gens] == [
        ([7, 8, 9], "length"), ([7, 8, EOS], "stop"), ([7, 42], "stop"), ([7, 42], "stop"), ([7, 8], "stop")]
    assert gens[1].logprobs == [-0.5, -0.25, 0.0] and gens[3].logprobs == [-0.5, 0.0]
    assert engine.stats["eos_appended"] == 2


async def test_client_errors_fail_at_once_and_bad_answers_are_named(fake_server, completion):
    fake_server.replies += [400, completion([1, 2], [-1.0]), {"choices": []},
                            completion([1], [-1.0], finish="abort")]
    engine = make_engine(fake_server)
    try:
        with pytest.raises(OpenAIEngineError, match="HTTP 400"):
            await engine.generate([1], PARAMS)
        assert len(fake_server.requests) == 1 and engine.stats["retries"] == 0
        with pytest.raises(OpenAIEngineError, match="no log-prob"):
            await engine.generate([1], PARAMS)
        with pytest.raises(OpenAIEngineError, match="unexpected completions response"):
            await engine.generate([1], PARAMS)
        with pytest.raises(OpenAIEngineError, match="finish_reason='abort'"):
            await engine.generate([1], PARAMS)
    finally:
        await engine.close()


async def test_server_errors_are_retried_with_backoff(fake_server):
    fake_server.replies += [503, 500, 429]
    engine = make_engine(fake_server, max_retries=3)
    try:
        gen = await engine.generate([1], PARAMS)
        assert gen.finish_reason == "stop" and engine.stats["retries"] == 3
        fake_server.replies += [502] * 3
        with pytest.raises(OpenAIEngineError, match="failed after 3 attempts: HTTP 502"):
            await make_engine(fake_server, max_retries=2).generate([1], PARAMS)
    finally:
        await engine.close()


async def test_connection_errors_are_retried_until_the_server_is_up(server_factory):
    make, start = server_factory
    server = make()  # not listening yet: the first attempts are refused
    engine = make_engine(server, max_retries=8, backoff_s=0.05, max_backoff_s=0.1)

    async def start_later():
        await asyncio.sleep(0.3)
        await start(server)

    try:
        gen, _ = await asyncio.gather(engine.generate([1, 2], PARAMS), start_later())
    finally:
        await engine.close()
    assert gen.token_ids and engine.stats["retries"] >= 1 and len(server.requests) == 1

    dead = make_engine(make(), max_retries=1)
    with pytest.raises(OpenAIEngineError, match="failed after 2 attempts: ConnectError"):
        await dead.generate([1], PARAMS)
    await dead.close()


async def test_timeouts_are_retried(fake_server):
    fake_server.delay_s = 0.5
    engine = make_engine(fake_server, timeout_s=0.1, max_retries=1)
    try:
        with pytest.raises(OpenAIEngineError, match="ReadTimeout|TimeoutError: no complete response"):  # whichever fires first
            await engine.generate([1], PARAMS)
    finally:
        await engine.close()
    assert engine.stats["retries"] == 1


async def test_concurrency_limit_and_model_discovery(fake_server):
    fake_server.delay_s = 0.05
    engine = make_engine(fake_server, model=None, max_concurrency=2)
    try:
        gens = await asyncio.gather(*(engine.generate([i], PARAMS) for i in range(6)))
    finally:
        await engine.close()
    assert len(gens) == 6 and fake_server.max_in_flight == 2
    assert {r["model"] for r in fake_server.requests} == {"served-model"}
