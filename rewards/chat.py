"""An OpenAI-compatible chat endpoint as one async call, shared by the model judges: the pairwise arena
judge (`rewards.judge.LLMJudge`) and the pointwise judge reward (`rewards.llm_reward`).

Each request has an overall deadline (`timeout_s`, not httpx's per-read timeout, which a server
dripping one byte at a time never trips) and a byte cap on the decoded body (`max_response_bytes`,
read as a stream, so a 300 MB reply or a gzip bomb is cut off, not buffered). Every failure (a
transport error, bad gzip, a body that is not JSON, a deadline) is retried and then surfaces as
`JudgeError` (`rl_factory.base.judging`), the one error the tournament's `on_judge_failure` handles.
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import os
import random
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rl_factory.base.http import request
from rl_factory.base.judging import JudgeError
from rl_factory.base.loop_local import LoopLocal

RETRY_STATUS = {408, 409, 425, 429}
CACHE_SIZE = 100_000  # replies (or verdicts) kept per client / judge
MAX_RESPONSE_BYTES = 8 << 20  # a chat completion is kilobytes; past this the body is not read further


class ChatClient:
    """One OpenAI-compatible chat endpoint, shared by the pairwise `LLMJudge` and the pointwise
    `rewards.llm_reward` judge: `await client.chat(messages) -> str`.

    An httpx (httpx2) async client posts to `{base_url}/chat/completions` with the API key read from the
    environment variable `api_key_env` (never from a config), at most `max_concurrency` requests in
    flight, `max_retries` retries with exponential backoff and jitter on transport errors, HTTP 408/429/5xx
    and replies `parse` rejects (other 4xx fail at once), and a cache of replies by request (`cache_size`
    0 turns it off; failures are never cached). The httpx client and the semaphore are rebuilt when the
    running event loop changes, so one client serves several `asyncio.run` calls.

    Args:
        stats: a dict to count `requests`, `retries` and `cache_hits` in (shared with a judge's own).
        extra_body: more request fields, merged into every request (not `model` or `messages`).
    """

    def __init__(self, base_url: str, model: str, api_key_env: str | None = "OPENAI_API_KEY",
                 max_concurrency: int = 8, max_retries: int = 3, backoff_s: float = 1.0,
                 timeout_s: float = 60.0, temperature: float = 0.0, max_tokens: int = 512,
                 cache_size: int = CACHE_SIZE, stats: dict[str, int] | None = None,
                 max_response_bytes: int = MAX_RESPONSE_BYTES, extra_body: dict[str, Any] | None = None):
        if not model:
            raise ValueError("an LLM judge needs a model name (the endpoint's model)")
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model, self.api_key_env = model, api_key_env
        self.max_concurrency, self.max_retries, self.backoff_s = max_concurrency, max_retries, backoff_s
        self.timeout_s, self.temperature, self.max_tokens = timeout_s, temperature, max_tokens
        self.cache_size, self.max_response_bytes = cache_size, max_response_bytes
        # merged into every request: e.g. vLLM's or OpenAI's `response_format` (a JSON schema the reply must
        # follow), so a small judge cannot answer outside the verdict's form
        self.extra_body = dict(extra_body or {})
        reserved = {"model", "messages"} & set(self.extra_body)
        if reserved:
            raise ValueError(f"judge extra_body may not set {sorted(reserved)} (the client sends them)")
        self._cache: dict[str, str] = {}
        self.stats = stats if stats is not None else {}
        for key in ("requests", "retries"):
            self.stats.setdefault(key, 0)
        # httpx clients and semaphores belong to one event loop
        self._bound = LoopLocal(lambda: (_httpx().AsyncClient(timeout=self.timeout_s),
                                         asyncio.Semaphore(self.max_concurrency)))

    def _headers(self) -> dict[str, str]:
        key = os.environ.get(self.api_key_env, "") if self.api_key_env else ""
        if key:
            # an endpoint may echo it (an error page, a reply) into what we log and write: mask it everywhere
            from rl_factory.base.secrets import protect

            protect([key], replacement=f"${{oc.env:{self.api_key_env}}}")
        return {"Authorization": f"Bearer {key}"} if key else {}

    async def chat(self, messages: list[dict[str, Any]], parse: Callable[[str], Any] | None = None) -> Any:
        """The assistant's reply to `messages`; with `parse`, `parse(reply)`, retrying when it raises
        ValueError (a reply without the expected verdict or score).

        Raises:
            JudgeError: refused (4xx), or still failing after the retries.
        """
        client, semaphore = self._bound.get()
        body = {"model": self.model, "messages": messages, "temperature": self.temperature,
                "max_tokens": self.max_tokens, **self.extra_body}
        key = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()
        if key in self._cache:
            self.stats["cache_hits"] = self.stats.get("cache_hits", 0) + 1
            return parse(self._cache[key]) if parse else self._cache[key]
        last: Exception | None = None
        for attempt in range(self.max_retries + 1):
            if attempt:
                self.stats["retries"] += 1
                await asyncio.sleep(self.backoff_s * 2 ** (attempt - 1) * random.uniform(0.5, 1.5))
            try:
                async with semaphore:
                    self.stats["requests"] += 1
                    status, content = await request(client, "POST", self.url, json=body,
                                                    headers=self._headers(), timeout_s=self.timeout_s,
                                                    max_bytes=self.max_response_bytes)
                if status >= 400:
                    error = f"HTTP {status}: {content[:200].decode('utf-8', 'replace')}"
                    if status < 500 and status not in RETRY_STATUS:
                        raise JudgeError(f"judge endpoint {self.url} refused the request ({error})")
                    raise ValueError(error)
                text = json.loads(content)["choices"][0]["message"]["content"] or ""
                if not isinstance(text, str):
                    raise TypeError(f"message content is {type(text).__name__}, not text")
                value = parse(text) if parse else text
            except JudgeError:
                raise
            except Exception as exc:  # noqa: BLE001 - any transport, decoding or reply failure: retried
                last = exc
                continue
            if self.cache_size > 0:
                self._cache[key] = text
                while len(self._cache) > self.cache_size:  # oldest first (dicts keep insertion order)
                    del self._cache[next(iter(self._cache))]
            return value
        raise JudgeError(f"judge {self.model} at {self.url} failed {self.max_retries + 1} times; "
                         f"last: {type(last).__name__}: {last}")

    async def aclose(self) -> None:
        bound = self._bound.pop()
        if bound is not None:
            await bound[0].aclose()


def _httpx():
    import httpx2  # the declared client (no fallback to httpx: rl_factory.base.http needs httpx2 anyway)

    return httpx2


def json_objects(text: str, parse_float: Callable[[str], Any] | None = None) -> list[dict]:
    """Every JSON object embedded anywhere in a model's reply (judges wrap verdicts in chatter)."""
    decoder, found = json.JSONDecoder(parse_float=parse_float), []
    for start in (m.start() for m in re.finditer(r"\{", text)):
        try:
            obj, _ = decoder.raw_decode(text, start)
        except ValueError:
            continue
        if isinstance(obj, dict):
            found.append(obj)
    return found


def load_template(prompt: str | None, default: str, required: tuple[str, ...], what: str) -> str:
    """`default`, a template file's text, or an inline template; it must use every `required` placeholder."""
    if not prompt:
        return default
    text = Path(prompt).read_text() if "\n" not in prompt and Path(prompt).is_file() else prompt
    if any(p not in text for p in required):
        raise ValueError(f"{what} {prompt[:80]!r} is neither a file nor a template with the "
                         f"{' and '.join(required)} placeholder{'s' if len(required) > 1 else ''}")
    return text


def fill_template(template: str, values: dict[str, str]) -> str:
    """Replace each placeholder by its value in one pass (JSON braces in a template need no escaping,
    and a value that happens to contain a placeholder is not filled again)."""
    return re.sub("|".join(re.escape(p) for p in values), lambda m: values[m.group(0)], template)
