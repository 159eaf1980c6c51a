"""An HTTP server that misbehaves on purpose, on 127.0.0.1, in a background thread.

    with hostile_server("drip") as server:
        ... server.url ... server.bytes_sent ...

Behaviours: `drip` (a 200 with a long Content-Length, then one byte every 0.2 s), `bad_gzip` (a body
marked gzip that is not), `huge` (a 200 whose JSON body never ends: 1 MiB chunks until the client
goes away, up to 300 MiB), `sse_silent` (an SSE stream that never sends its `endpoint` event, only
comments). Raw asyncio, so nothing in an HTTP framework can make it behave.
"""
from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager


class HostileServer:
    def __init__(self, behaviour: str):
        self.behaviour = behaviour
        self.bytes_sent = 0
        self.requests = 0
        self.url = ""

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.requests += 1
        try:
            await reader.readuntil(b"\r\n\r\n")
            await getattr(self, self.behaviour)(writer)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass
        finally:
            writer.close()

    async def send(self, writer: asyncio.StreamWriter, data: bytes) -> None:
        writer.write(data)
        await writer.drain()
        self.bytes_sent += len(data)

    async def drip(self, writer: asyncio.StreamWriter) -> None:
        await self.send(writer, b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n")
        for _ in range(100_000):
            await self.send(writer, b" ")
            await asyncio.sleep(0.2)

    async def bad_gzip(self, writer: asyncio.StreamWriter) -> None:
        body = b"\x1f\x8b this is not gzip at all"
        await self.send(writer, b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Encoding: gzip\r\n"
                                b"Content-Length: %d\r\n\r\n" % len(body) + body)

    async def huge(self, writer: asyncio.StreamWriter) -> None:
        await self.send(writer, b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                                b"Content-Length: %d\r\n\r\n" % (300 << 20))
        await self.send(writer, b'{"choices": [{"message": {"content": "')
        chunk = b"a" * (1 << 20)
        for _ in range(299):
            await self.send(writer, chunk)

    async def sse_silent(self, writer: asyncio.StreamWriter) -> None:
        await self.send(writer, b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n\r\n")
        for _ in range(10_000):
            await self.send(writer, b": still here, no endpoint for you\n\n")
            await asyncio.sleep(0.5)


@contextmanager
def hostile_server(behaviour: str) -> Iterator[HostileServer]:
    server = HostileServer(behaviour)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    loop = asyncio.new_event_loop()
    started = threading.Event()
    holder: dict = {}

    async def serve() -> None:
        holder["server"] = await asyncio.start_server(server.handle, "127.0.0.1", port)
        started.set()

    thread = threading.Thread(target=lambda: (loop.run_until_complete(serve()), loop.run_forever()), daemon=True)
    thread.start()
    started.wait(10)
    server.url = f"http://127.0.0.1:{port}"
    try:
        yield server
    finally:
        async def stop() -> None:
            holder["server"].close()
            for task in asyncio.all_tasks():
                if task is not asyncio.current_task():
                    task.cancel()

        asyncio.run_coroutine_threadsafe(stop(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
