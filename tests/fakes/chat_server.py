"""A small OpenAI-compatible chat endpoint for the LLM-judge tests (starlette + uvicorn, 127.0.0.1).

The tests' prompt templates start with `MODE <mode>`; `answer(endpoint, mode, prompt)` decides the
reply: a string is wrapped as the assistant message, a Response is sent as it is (errors, garbage).
The endpoint counts requests per mode and records the peak of requests in flight, every body, every
prompt and every Authorization header.
"""
from __future__ import annotations

import asyncio
import re
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route


class ChatEndpoint:
    def __init__(self, answer: Callable[[ChatEndpoint, str, str], str | Response]):
        self.answer = answer
        self.requests: Counter[str] = Counter()  # by mode
        self.in_flight = self.peak = 0
        self.bodies: list[dict[str, Any]] = []
        self.auth: list[str] = []
        self.base_url = ""

    @property
    def prompts(self) -> list[str]:
        return [body["messages"][-1]["content"] for body in self.bodies]

    async def chat(self, request: Request) -> Response:
        body = await request.json()
        self.bodies.append(body)
        self.auth.append(request.headers.get("authorization", ""))
        prompt = body["messages"][-1]["content"]
        mode = re.match(r"MODE (\S+)", prompt).group(1)
        self.requests[mode] += 1
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        try:
            await asyncio.sleep(0.02)  # long enough for concurrent requests to overlap
            reply = self.answer(self, mode, prompt)
        finally:
            self.in_flight -= 1
        if isinstance(reply, Response):
            return reply
        return JSONResponse({"id": "x", "object": "chat.completion",
                             "choices": [{"index": 0, "message": {"role": "assistant", "content": reply}}]})


@contextmanager
def running_chat_endpoint(answer: Callable[[ChatEndpoint, str, str], str | Response]) -> Iterator[ChatEndpoint]:
    """The endpoint served in a thread; `endpoint.base_url` is its `/v1` URL."""
    endpoint = ChatEndpoint(answer)
    app = Starlette(routes=[Route("/v1/chat/completions", endpoint.chat, methods=["POST"])])
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.01)
    endpoint.base_url = f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
    try:
        yield endpoint
    finally:
        server.should_exit = True
        thread.join(timeout=5)
        sock.close()
