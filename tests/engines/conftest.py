"""A small OpenAI-compatible completions server for engine tests, run in the test's event loop.

`FakeServer` answers `POST /v1/completions` and `GET /v1/models` with starlette + uvicorn on a
free local port. Each test queues the replies it wants (`server.replies.append(...)`): a dict is a
200 JSON body, an int an error status, and a callable gets the request body and returns either.
With no reply queued it answers a fixed turn. Every request body and header is recorded.

Helpers are handed out as fixtures (not imported from here), as in tests/envs.
"""
from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from tests.fakes.net import free_port

DEFAULT_IDS = [11, 12, 13, 2]
DEFAULT_LOGPROBS = [-0.25, -1.5, -0.125, -0.0625]


def completion_body(ids: list[int], logprobs: list[float], finish: str = "stop", stop_reason: Any = None,
               with_token_ids: bool = True, tokens: list[str] | None = None) -> dict:
    """A vLLM-shaped completions body for one choice."""
    choice = {
        "index": 0,
        "text": "<ignored>",
        "logprobs": {"tokens": tokens if tokens is not None else [f"token_id:{i}" for i in ids],
                     "token_logprobs": logprobs, "top_logprobs": None, "text_offset": list(range(len(ids)))},
        "finish_reason": finish,
        "stop_reason": stop_reason,
    }
    if with_token_ids:
        choice["token_ids"] = ids
    return {"id": "cmpl-1", "object": "text_completion", "model": "fake", "choices": [choice],
            "usage": {"prompt_tokens": 0, "completion_tokens": len(ids), "total_tokens": len(ids)}}


class FakeServer:
    def __init__(self, port: int):
        self.port = port
        self.base_url = f"http://127.0.0.1:{port}/v1"
        self.replies: list[dict | int | Callable[[dict], dict | int]] = []
        self.requests: list[dict] = []
        self.headers: list[dict] = []
        self.delay_s = 0.0
        self.in_flight = self.max_in_flight = 0
        self.app = Starlette(routes=[Route("/v1/completions", self.completions, methods=["POST"]),
                                     Route("/v1/models", self.models, methods=["GET"])])

    async def completions(self, request: Request) -> JSONResponse:
        body = await request.json()
        self.requests.append(body)
        self.headers.append(dict(request.headers))
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            await asyncio.sleep(self.delay_s)
        finally:
            self.in_flight -= 1
        reply = self.replies.pop(0) if self.replies else completion_body(DEFAULT_IDS, DEFAULT_LOGPROBS)
        if callable(reply):
            reply = reply(body)
        if isinstance(reply, int):
            return JSONResponse({"error": {"message": f"status {reply}"}}, status_code=reply)
        return JSONResponse(reply)

    async def models(self, request: Request) -> JSONResponse:
        return JSONResponse({"object": "list", "data": [{"id": "served-model", "object": "model"}]})


async def serve(server: FakeServer) -> tuple[uvicorn.Server, asyncio.Task]:
    """Start `server` in this event loop; returns once it accepts connections."""
    config = uvicorn.Config(server.app, host="127.0.0.1", port=server.port, log_level="warning",
                            lifespan="off")
    runner = uvicorn.Server(config)
    task = asyncio.get_running_loop().create_task(runner.serve())
    while not runner.started:
        if task.done():
            task.result()  # raises why it could not start
        await asyncio.sleep(0.01)
    return runner, task


async def shutdown(runner: uvicorn.Server, task: asyncio.Task) -> None:
    runner.should_exit = True
    await task


@pytest.fixture
def completion():
    """completion(ids, logprobs, finish="stop", stop_reason=None, with_token_ids=True, tokens=None)."""
    return completion_body


@pytest.fixture
async def server_factory():
    """server_factory() -> a FakeServer on a free port, not yet started; start(server) starts it.
    Whatever was started is shut down after the test."""
    started = []

    async def start(server: FakeServer) -> None:
        started.append(await serve(server))

    yield lambda: FakeServer(free_port()), start
    for runner, task in started:
        await shutdown(runner, task)


@pytest.fixture
async def fake_server(server_factory):
    make, start = server_factory
    server = make()
    await start(server)
    return server


@pytest.fixture
def threaded_server():
    """threaded_server() -> a started FakeServer running in its own thread and event loop, for
    code under test that runs its own `asyncio.run` (the CLI); stopped after the test."""
    import threading
    import time

    started = []

    def start() -> FakeServer:
        server = FakeServer(free_port())
        runner = uvicorn.Server(uvicorn.Config(server.app, host="127.0.0.1", port=server.port,
                                               log_level="warning", lifespan="off"))
        thread = threading.Thread(target=runner.run, daemon=True)
        thread.start()
        while not runner.started:
            time.sleep(0.01)
        started.append((runner, thread))
        return server

    yield start
    for runner, thread in started:
        runner.should_exit = True
        thread.join(timeout=10)
