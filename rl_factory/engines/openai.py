"""An engine for a running vLLM or SGLang server, through the OpenAI-compatible completions API.

Token ids in, token ids out: the prompt is sent as a list of ids to the legacy `POST
{base_url}/completions` endpoint (the chat endpoint would re-render and re-tokenize the history),
with `logprobs: 1` for the log-prob of every sampled token. The sampled ids are read back from
`choices[0].token_ids` (vLLM's `return_token_ids: true`) or, failing that, from the logprob
tokens when they come as `"token_id:<id>"` strings (vLLM's `return_tokens_as_token_ids: true`);
both are requested, and when a server returns both they must agree. A server that returns only
token text is refused: decoding text back to ids is exactly what token faithfulness forbids.

Departures from the server's answer, both documented in `Generation` terms:
  * eos: vLLM includes the stop token in the ids and log-probs. If a server stops on it ("stop"
    with no stop string) but leaves it out, it is appended (the token the server's
    `stop_reason` names, else `eos_token_id`) with log-prob 0.0, since the server sampled it and
    the chat template needs it to end the turn; `stats["eos_appended"]` counts these.
  * log-probs: the contract is log softmax(logits / temperature). vLLM returns raw log-probs by
    default (`--logprobs-mode raw_logprobs`), which is the same thing at temperature 1; sample at
    another temperature only with `--logprobs-mode processed_logprobs` (it also folds in top-p).

Each attempt has an overall deadline (`timeout_s`) and a byte cap (rl_factory.base.http). Connection errors,
timeouts, 408, 429 and 5xx are retried with exponential backoff; other 4xx
(a prompt longer than the server's `max_model_len`, a wrong model name) fail at once.
"""
from __future__ import annotations

import asyncio
import json
import os
import random
from collections.abc import Sequence
from typing import Any

import httpx2

from rl_factory.base import http
from rl_factory.engines.base import Generation, SamplingParams, register_engine

RETRY_STATUS = {408, 429, 500, 502, 503, 504}
MAX_RESPONSE_BYTES = 64 << 20  # one completion's ids and log-probs are far less
TOKEN_ID_PREFIX = "token_id:"


class OpenAIEngineError(RuntimeError):
    """The server could not be reached after all retries, refused the request, or gave an answer
    that cannot be turned into exact token ids and log-probs."""


@register_engine("openai")
class OpenAIEngine:
    """Generation on an OpenAI-compatible completions server (vLLM, SGLang).

    Args:
        base_url: the API root, e.g. `http://127.0.0.1:8000/v1`.
        model: the served model name; None asks the server (`GET /models`) once.
        eos_token_id: the end-of-turn id (or several; the first is the one appended) that the
            server stops on; appended when the server stops on it but leaves it out.
        api_key_env: environment variable holding the API key (sent as a Bearer token); unset or
            empty means no key.
        max_concurrency: requests in flight at once (the server batches them).
        timeout_s: per request attempt.
        max_retries: further attempts after a connection error, timeout, 408, 429 or 5xx.
        backoff_s: wait before the first retry; doubles each retry (with jitter) up to max_backoff_s.
        extra_body: merged into every request body (e.g. `{"top_k": 20}`).
    """

    def __init__(self, base_url: str, model: str | None = None, eos_token_id: int | Sequence[int] | None = None,
                 api_key_env: str = "OPENAI_API_KEY", max_concurrency: int = 256, timeout_s: float = 600.0,
                 max_retries: int = 5, backoff_s: float = 0.5, max_backoff_s: float = 30.0,
                 extra_body: dict[str, Any] | None = None):
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.eos_ids = [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id or [])
        self.api_key_env = api_key_env
        self.max_concurrency = max_concurrency
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.backoff_s, self.max_backoff_s = backoff_s, max_backoff_s
        self.extra_body = dict(extra_body or {})
        self.stats = {"requests": 0, "retries": 0, "eos_appended": 0}
        self._client: httpx2.AsyncClient | None = None
        self._slots = asyncio.Semaphore(max_concurrency)
        self._model_lock = asyncio.Lock()

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> Generation:
        body = {
            "model": self.model or await self._served_model(),
            "prompt": list(prompt_ids),
            "max_tokens": params.max_new_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "n": 1,
            "stream": False,
            "logprobs": 1,
            "return_token_ids": True,
            "return_tokens_as_token_ids": True,
            **self.extra_body,
        }
        async with self._slots:
            data = await self._request("POST", "/completions", body)
        self.stats["requests"] += 1
        try:
            return self._generation(data["choices"][0])
        except (KeyError, IndexError, TypeError) as exc:
            raise OpenAIEngineError(f"unexpected completions response ({exc!r}): {str(data)[:300]}") from None

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    async def _served_model(self) -> str:
        async with self._model_lock:
            if self.model is None:
                models = (await self._request("GET", "/models")).get("data") or []
                if not models:
                    raise OpenAIEngineError(f"{self.base_url}/models lists no model; pass `model`")
                self.model = models[0]["id"]
        return self.model

    async def _request(self, method: str, path: str, body: dict | None = None) -> dict:
        client = self._http()
        url = self.base_url + path
        for attempt in range(self.max_retries + 1):
            try:  # an overall deadline and a byte cap per attempt (rl_factory.base.http)
                status, content = await http.request(client, method, url, json=body, timeout_s=self.timeout_s,
                                                     max_bytes=MAX_RESPONSE_BYTES)
            except (httpx2.HTTPError, TimeoutError, OSError) as exc:  # refused, reset, timed out, bad encoding
                problem = f"{type(exc).__name__}: {exc}"
            except http.ResponseTooLarge as exc:
                raise OpenAIEngineError(f"{method} {url}: {exc}") from None
            else:
                text = content[:300].decode("utf-8", "replace")
                if status < 400:
                    try:
                        return json.loads(content)
                    except ValueError:
                        raise OpenAIEngineError(f"{method} {url}: response is not JSON: {text}") from None
                problem = f"HTTP {status}: {text}"
                if status not in RETRY_STATUS:
                    raise OpenAIEngineError(f"{method} {url}: {problem}")
            if attempt == self.max_retries:
                break
            self.stats["retries"] += 1
            delay = min(self.max_backoff_s, self.backoff_s * 2 ** attempt)
            await asyncio.sleep(delay * random.uniform(0.5, 1.0))  # jitter: retries don't arrive in waves
        raise OpenAIEngineError(f"{method} {url} failed after {self.max_retries + 1} attempts: {problem}")

    def _http(self) -> httpx2.AsyncClient:
        if self._client is None:
            key = os.environ.get(self.api_key_env, "")
            self._client = httpx2.AsyncClient(
                headers={"Authorization": f"Bearer {key}"} if key else {},
                timeout=httpx2.Timeout(self.timeout_s, connect=min(self.timeout_s, 10.0)),
                limits=httpx2.Limits(max_connections=self.max_concurrency,
                                     max_keepalive_connections=self.max_concurrency),
            )
        return self._client

    def _generation(self, choice: dict) -> Generation:
        logprobs = choice.get("logprobs") or {}
        token_logprobs = logprobs.get("token_logprobs")
        tokens = logprobs.get("tokens") or []
        ids = choice.get("token_ids")
        parsed = [_token_id(t) for t in tokens]
        if ids is None:
            if None in parsed:
                raise OpenAIEngineError(
                    "the server returned token text, not token ids (got tokens like "
                    f"{tokens[:3]!r}); vLLM needs `return_token_ids` or `return_tokens_as_token_ids`")
            ids = parsed
        elif tokens and parsed != list(ids):
            raise OpenAIEngineError("the server's token_ids and its logprob tokens disagree")
        if token_logprobs is None or len(token_logprobs) != len(ids) or None in token_logprobs:
            raise OpenAIEngineError("the server returned no log-prob for some generated token "
                                    f"({len(ids)} ids, log-probs {str(token_logprobs)[:100]})")
        ids, token_logprobs = list(ids), [float(x) for x in token_logprobs]
        finish = choice.get("finish_reason")
        if finish == "stop":
            stop_token = self._omitted_stop_token(ids, choice.get("stop_reason"))
            if stop_token is not None:
                ids.append(stop_token)
                token_logprobs.append(0.0)  # the server sampled it but did not report it
                self.stats["eos_appended"] += 1
        elif finish != "length":
            raise OpenAIEngineError(f"generation ended with finish_reason={finish!r}")
        return Generation(ids, token_logprobs, finish)

    def _omitted_stop_token(self, ids: list[int], stop_reason: Any) -> int | None:
        """The id the server stopped on when it left it out of `ids`; None when it is there (or
        the server stopped on a stop string, which has no single id)."""
        if isinstance(stop_reason, int) and not isinstance(stop_reason, bool):
            return None if ids and ids[-1] == stop_reason else stop_reason
        if stop_reason is None and self.eos_ids and (not ids or ids[-1] not in self.eos_ids):
            return self.eos_ids[0]
        return None


def _token_id(token: Any) -> int | None:
    if isinstance(token, str) and token.startswith(TOKEN_ID_PREFIX):
        try:
            return int(token[len(TOKEN_ID_PREFIX):])
        except ValueError:
            return None
    return None
