"""Serve an MCPServer over stdio without a thread hop per message.

The SDK's stdio transport (`mcp.server.stdio.stdio_server`) reads each request line and writes
and flushes each response in anyio worker threads: three thread hand-offs per call, which cost a
server ~0.7 ms of CPU per call and halve how many calls one server process can answer
(benchmarks/README.md). `run_stdio(server)` feeds the same SDK transport (its JSON-RPC parsing
and serialization are unchanged) from non-blocking asyncio pipes instead.

Like the SDK it keeps stray output off the wire: while serving, fd 0 reads /dev/null and fd 1
writes to stderr, so a tool's `print()` cannot corrupt a response. When stdin or stdout is not
a pipe or socket (a terminal or a file, say), it falls back to `server.run()`.

    from envs.servers.stdio import run_stdio
    run_stdio(build_server())          # instead of build_server().run()
"""
from __future__ import annotations

import asyncio
import os
import stat
from typing import Any

# Longest request line accepted (asyncio's default of 64 KiB would reject big arguments).
MAX_LINE_BYTES = 256 * 1024 * 1024


def serve(server: Any, transport: str = "stdio", host: str = "127.0.0.1", port: int = 8000) -> None:
    """A bundled server's main loop: stdio through `run_stdio`, HTTP transports through the SDK."""
    if transport == "stdio":
        run_stdio(server)
    else:
        server.run(transport, host=host, port=port)


def run_stdio(server: Any) -> None:
    """Serve `server` (an `MCPServer`) on this process's stdin/stdout until stdin closes."""
    lowlevel = getattr(server, "_lowlevel_server", None)  # the SDK's own in-memory client reads it too
    if lowlevel is None or not (_is_pipe(0) and _is_pipe(1)):
        server.run()
        return
    asyncio.run(_serve(lowlevel))


async def _serve(lowlevel: Any) -> None:
    from mcp.server.stdio import stdio_server

    loop = asyncio.get_running_loop()
    wire_in, wire_out = _divert_std_fds()
    reader = asyncio.StreamReader(limit=MAX_LINE_BYTES)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader),
                                 os.fdopen(wire_in, "rb", buffering=0))
    transport, protocol = await loop.connect_write_pipe(asyncio.streams.FlowControlMixin,
                                                        os.fdopen(wire_out, "wb", buffering=0))
    writer = asyncio.StreamWriter(transport, protocol, None, loop)
    try:
        async with stdio_server(stdin=_LineReader(reader), stdout=_Writer(writer)) as (read, write):
            await lowlevel.run(read, write, lowlevel.create_initialization_options())
    finally:
        writer.close()


class _LineReader:
    """The part of `anyio.AsyncFile[str]` stdio_server reads: async iteration over lines."""

    def __init__(self, reader: asyncio.StreamReader):
        self._reader = reader

    def __aiter__(self) -> _LineReader:
        return self

    async def __anext__(self) -> str:
        line = await self._reader.readline()
        if not line:
            raise StopAsyncIteration
        return line.decode("utf-8", errors="replace")  # as the SDK's stdin wrapper does


class _Writer:
    """The part of `anyio.AsyncFile[str]` stdio_server writes: `write` then `flush`."""

    def __init__(self, writer: asyncio.StreamWriter):
        self._writer = writer

    async def write(self, text: str) -> None:
        self._writer.write(text.encode("utf-8"))

    async def flush(self) -> None:
        await self._writer.drain()  # waits only when the client stops reading (backpressure)


def _is_pipe(fd: int) -> bool:
    """Pipes and sockets are what MCP clients connect and what epoll can watch."""
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)


def _divert_std_fds() -> tuple[int, int]:
    """Private duplicates of fds 0 and 1 for the wire; fd 0 then reads /dev/null, fd 1 goes to stderr."""
    wire_in, wire_out = os.dup(0), os.dup(1)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.dup2(2, 1)
    return wire_in, wire_out
