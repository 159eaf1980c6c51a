"""One HTTP request with an overall deadline and a byte cap: what every client of ours that talks to a
model endpoint uses (the LLM judges' `rewards.chat.ChatClient`, the `openai` generation engine).

httpx's own timeouts are per operation: a server that sends one byte every few seconds never trips
a read timeout, and `response.read()` buffers a body of any size. `request` bounds the whole
exchange (connect, send, every byte of the body) by `timeout_s` and stops reading past `max_bytes`
of decoded body (so a gzip bomb counts by what it expands to). Bottom layer: imports only httpx2.
"""
from __future__ import annotations

import asyncio
from typing import Any

import httpx2


class ResponseTooLarge(ValueError):
    """The body went past the byte cap."""


async def request(client: httpx2.AsyncClient, method: str, url: str, *, timeout_s: float, max_bytes: int,
                  **kwargs: Any) -> tuple[int, bytes]:
    """(status, decoded body) of one request.

    Raises:
        TimeoutError: the whole exchange took longer than `timeout_s`.
        ResponseTooLarge: the decoded body is longer than `max_bytes`.
        httpx2.HTTPError (transport errors, bad content encoding, ...): as httpx raises them.
    """
    try:
        return await asyncio.wait_for(_read(client, method, url, max_bytes, kwargs), timeout_s)
    except asyncio.TimeoutError:  # the builtin TimeoutError only from Python 3.11
        raise TimeoutError(f"no complete response within {timeout_s:g}s") from None


async def _read(client: httpx2.AsyncClient, method: str, url: str, max_bytes: int,
                kwargs: dict[str, Any]) -> tuple[int, bytes]:
    async with client.stream(method, url, **kwargs) as response:
        chunks, size = [], 0
        async for chunk in response.aiter_bytes():
            size += len(chunk)
            if size > max_bytes:
                raise ResponseTooLarge(f"response body exceeded the {max_bytes} byte limit")
            chunks.append(chunk)
        return response.status_code, b"".join(chunks)
