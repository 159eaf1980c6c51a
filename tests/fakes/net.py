"""Loopback helpers for the tests and benchmarks that start servers: a free port, and waiting until one
listens. The one copy: tests/engines, tests/envs and benchmarks/{soak,tool_calls}.py import it."""
from __future__ import annotations

import asyncio
import socket
import time


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def wait_for_port(port: int, timeout_s: float = 30.0) -> None:
    """Return once 127.0.0.1:`port` accepts a connection; after `timeout_s`, raise the last refusal."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.05)
