"""How a connection reaches its MCP server: stdio, streamable HTTP or SSE, each with a byte cap.

A registry (`TRANSPORTS`) keyed by `ServerSpec.transport`; each entry opens an async context that yields
the SDK's `(read_stream, write_stream)` pair for a `ClientSession`.

Every transport bounds what one message may cost. A message (a stdio line, an HTTP body line, an SSE
event) longer than the connection's `max_message_bytes` is dropped while it is read, never buffered whole;
its request fails with a JSON-RPC error whose message says "exceeded the N byte limit" (`mcp_client`
counts it as a "too_large" tool error), and the connection goes on.

stdio is our own small transport rather than the SDK's `stdio_client`: the SDK splits lines by
concatenating strings (quadratic: 40 s for one 32 MiB line) and keeps the line whole; a dropped line must
still answer its request; and the server's stderr must be scrubbed of its secrets before it reaches
`tool_logs/<server>.log`, so it goes through a pipe we read. Spawning (own session, the SDK's default
environment plus the manifest's `env`) and shutdown (close stdin, wait 2 s, SIGTERM the process group,
2 s, SIGKILL) follow the SDK.

SSE (the legacy HTTP+SSE transport) is our own too: every answer arrives on one long-lived event stream,
and the SDK's `sse_client` ends it, with every call in flight, on the first event over a fixed 1 MiB.
Ours frames events from the raw bytes (`sse_events`), keeps only the head of an oversized one and answers
its request, as stdio does. Connecting (redirects only within the origin, the endpoint on the same origin)
and posting (one message at a time, in order: a server may refuse requests that overtake
`notifications/initialized`) follow the SDK.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
from collections.abc import AsyncIterable, AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import IO, TYPE_CHECKING, Any, Protocol
from urllib.parse import urljoin, urlsplit

import anyio
import anyio.abc
import httpx2
import mcp_types
from mcp.client.stdio import get_default_environment
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import (MCP_DEFAULT_SSE_READ_TIMEOUT, MCP_DEFAULT_TIMEOUT,
                                     request_within_origin, stream_within_origin)
from mcp.shared.message import SessionMessage

if TYPE_CHECKING:
    from envs.manifest import ServerSpec

READ_CHUNK = 1 << 16
STDERR_LINE_BYTES = 64 * 1024  # a longer stderr line is written (scrubbed) in pieces, cut outside any secret
TERMINATE_GRACE_S = 2.0  # after closing stdin, then again after SIGTERM (the SDK's values)
TOO_LARGE = -32097  # our JSON-RPC error code for a dropped oversized message
ID_IN_HEAD = re.compile(rb'"id"\s*:\s*(-?\d+|"(?:[^"\\]|\\.){0,200}")')
HEAD_BYTES = 4096  # kept of a dropped message, to find its request id
SSE_SLACK_BYTES = 64 * 1024
SSE_HEADERS = {"Accept": "text/event-stream", "Cache-Control": "no-store"}
EVENT_STREAM = "text/event-stream"


class Connection(Protocol):
    """What a transport reads of its `envs.mcp_client.MCPServerConnection` (which imports this module);
    `_errlog` is the server's stderr log, which `log_to` may swap while the server runs."""
    spec: ServerSpec
    max_message_bytes: int
    _errlog: IO[bytes] | None


def too_large_message(size: int, limit: int) -> str:
    return f"message of {size} bytes exceeded the {limit} byte limit (env.max_tool_output_bytes x 16)"


class MessageTooLarge(httpx2.StreamError):
    """An HTTP body line past the byte cap (a StreamError: the SDK answers the request with it)."""


@asynccontextmanager
async def stdio_transport(conn: Connection) -> AsyncIterator[tuple[Any, Any]]:
    spec = conn.spec
    process = await anyio.open_process(
        [spec.command, *spec.args], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env={**get_default_environment(), **spec.env}, cwd=spec.cwd, start_new_session=True)
    read_writer, read_stream = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write_stream, write_reader = anyio.create_memory_object_stream[SessionMessage](0)

    async def stdout_reader() -> None:
        async with read_writer:
            try:
                async for line, size in read_lines(process.stdout, conn.max_message_bytes):
                    if size:
                        await read_writer.send(_message(line, size, conn.max_message_bytes))
            except (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream, OSError):
                pass  # the process or the session is gone: the session sees the stream end

    async def stdin_writer() -> None:
        try:
            async with write_reader:
                async for message in write_reader:
                    data = message.message.model_dump_json(by_alias=True, exclude_unset=True) + "\n"
                    await process.stdin.send(data.encode("utf-8", "replace"))
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            await read_writer.aclose()  # a request must not wait on a server that cannot read it

    async with anyio.create_task_group() as tg:
        tg.start_soon(stdout_reader)
        tg.start_soon(stdin_writer)
        tg.start_soon(pump_stderr, process.stderr, lambda: conn._errlog, spec.redact,  # log_to may move it
                      getattr(spec, "_secrets", ()))
        try:
            yield read_stream, write_stream
        finally:
            with anyio.CancelScope(shield=True):  # the child must not outlive us, even on cancel
                await write_stream.aclose()
                await _stop(process)
            tg.cancel_scope.cancel()


async def read_lines(chunks: AsyncIterable[bytes], limit: int) -> AsyncIterator[tuple[bytes, int]]:
    """Newline-framed lines (blank ones too) as (bytes, size); past `limit` only the head is kept."""
    buf, size, over = bytearray(), 0, False
    async for chunk in chunks:
        start = 0
        while True:
            end = chunk.find(b"\n", start)
            piece = chunk[start:] if end < 0 else chunk[start:end]
            size += len(piece)
            if not over and size > limit:
                over = True
                del buf[HEAD_BYTES:]
            if not over:
                buf += piece
            elif len(buf) < HEAD_BYTES:
                buf += piece[:HEAD_BYTES - len(buf)]
            if end < 0:
                break
            yield bytes(buf), size
            buf, size, over, start = bytearray(), 0, False, end + 1


def _message(line: bytes, size: int, limit: int) -> SessionMessage | Exception:
    if size > limit:
        found = ID_IN_HEAD.search(line)
        error = mcp_types.ErrorData(code=TOO_LARGE, message=too_large_message(size, limit))
        try:
            request_id = json.loads(found.group(1)) if found else None
        except ValueError:
            request_id = None
        if request_id is None:  # no id to answer: the request runs into its timeout
            return ValueError(error.message)
        return SessionMessage(mcp_types.JSONRPCError(jsonrpc="2.0", id=request_id, error=error))
    try:
        text = line.decode("utf-8", "replace")  # bad bytes must not kill the reader
        return SessionMessage(mcp_types.jsonrpc_message_adapter.validate_json(text, by_name=False))
    except ValueError as exc:  # a stray print, a banner: the session logs it and goes on
        return exc


async def pump_stderr(stream: anyio.abc.ByteReceiveStream, log: Callable[[], IO[bytes] | None],
                      redact: Callable[[str], str], secrets: tuple[str, ...] = ()) -> None:
    """Copy a server's stderr into its log (`log()`: the file it goes to now), line by line, with its
    secrets scrubbed; a line past STDERR_LINE_BYTES goes in pieces cut where no secret (`secrets`, the
    server's, or one the process knows) is split, so each piece is scrubbed whole."""
    from rl_factory.base.secrets import redact_known, safe_cut

    pending = bytearray()
    try:
        while True:
            try:
                chunk = await stream.receive(READ_CHUNK)
            except anyio.EndOfStream:
                break
            pending += chunk
            cut = pending.rfind(b"\n") + 1 or (safe_cut(bytes(pending), secrets) if len(pending) > STDERR_LINE_BYTES
                                                else 0)
            if cut:
                _write_log(log(), redact_known(redact(pending[:cut].decode("utf-8", "replace"))))
                del pending[:cut]
    except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
        pass
    if pending:
        _write_log(log(), redact_known(redact(pending.decode("utf-8", "replace"))))


def _write_log(log: IO[bytes] | None, text: str) -> None:
    with contextlib.suppress(OSError, ValueError):  # a full disk must not take the connection down
        if log is not None and not log.closed:
            log.write(text.encode("utf-8"))
            log.flush()


async def _stop(process: anyio.abc.Process) -> None:
    try:  # a server on its way out yields the CPU to the run (interpreter exit costs ~0.1 s each; episodes exit by the batch)
        os.setpriority(os.PRIO_PGRP, process.pid, 19)
    except (OSError, AttributeError):
        pass
    for step in ("stdin", signal.SIGTERM, signal.SIGKILL):
        if step == "stdin":
            try:
                await process.stdin.aclose()
            except (OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
                pass
        else:
            try:
                os.killpg(process.pid, step)
            except (ProcessLookupError, PermissionError):
                pass
        # Polled, not process.wait(): that also waits for the pipes' EOF, which a grandchild holding
        # them would delay forever. Backing off (5 ms, doubling to 80 ms): a batch of episodes stops its
        # servers together, and 64 fixed 10 ms pollers cost the event loop more than the exits do.
        with anyio.move_on_after(TERMINATE_GRACE_S):
            delay = 0.005
            while process.returncode is None:
                await anyio.sleep(delay)
                delay = min(2 * delay, 0.08)
        if process.returncode is not None:
            break
    for pipe in (process.stdout, process.stderr):
        try:
            await pipe.aclose()
        except (OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
            pass



class CappedTransport(httpx2.AsyncBaseTransport):
    """An httpx transport whose response bodies may not hold a line longer than `max_line_bytes`.

    Lines, not whole bodies: an SSE stream may stay open for hours, but no one event (a line) and
    no JSON body (one line) may be larger. Responses are asked for uncompressed (`identity`), so the
    bytes counted are the bytes parsed. With `events_capped_by_reader`, event streams pass through
    whole: the SSE transport's own reader caps them per event, and one event must not end them.
    """

    def __init__(self, max_line_bytes: int, events_capped_by_reader: bool = False, **transport_options: Any):
        self.inner = httpx2.AsyncHTTPTransport(**transport_options)
        self.max_line_bytes, self.events_capped_by_reader = max_line_bytes, events_capped_by_reader

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        request.headers["Accept-Encoding"] = "identity"
        response = await self.inner.handle_async_request(request)
        if not (self.events_capped_by_reader and _is_event_stream(response)):
            response.stream = _CappedStream(response.stream, self.max_line_bytes)
        return response

    async def aclose(self) -> None:
        await self.inner.aclose()


class _CappedStream(httpx2.AsyncByteStream):
    def __init__(self, inner: Any, limit: int):
        self.inner, self.limit = inner, limit

    async def __aiter__(self) -> AsyncIterator[bytes]:
        run = 0  # bytes since the last newline
        async for chunk in self.inner:
            first = chunk.find(b"\n")
            longest = run + (len(chunk) if first < 0 else first)
            if longest > self.limit:
                raise MessageTooLarge(too_large_message(longest, self.limit))
            run = run + len(chunk) if first < 0 else len(chunk) - chunk.rfind(b"\n") - 1
            yield chunk

    async def aclose(self) -> None:
        await self.inner.aclose()


def _is_event_stream(response: httpx2.Response) -> bool:
    return response.headers.get("content-type", "").partition(";")[0].strip().lower() == EVENT_STREAM


def http_client(conn: Connection, headers: dict[str, str] | None = None,
                events_capped_by_reader: bool = False) -> httpx2.AsyncClient:
    """The httpx client of an HTTP/SSE connection (the SDK's timeouts, our byte cap)."""
    # Each in-flight call holds its own connection (a POST answered by an SSE stream), so keep as
    # many alive as calls may be in flight: httpx's default of 20 reconnected per call past 20 in
    # flight (5x slower; benchmarks/README.md). `max_concurrency` bounds the total.
    limits = httpx2.Limits(max_connections=None, max_keepalive_connections=conn.spec.max_concurrency)
    # A little above the SSE event cap, so that over streamable HTTP an oversized event is reported
    # by the SDK's own event decoder (which answers its request) rather than by a broken stream.
    line_cap = conn.max_message_bytes + SSE_SLACK_BYTES
    return httpx2.AsyncClient(
        headers=headers, transport=CappedTransport(line_cap, events_capped_by_reader, limits=limits),
        timeout=httpx2.Timeout(MCP_DEFAULT_TIMEOUT, read=MCP_DEFAULT_SSE_READ_TIMEOUT))


@asynccontextmanager
async def streamable_http_transport(conn: Connection) -> AsyncIterator[Any]:
    # In SDK 2.x headers live on the httpx2 client, which we then own and must close.
    async with (http_client(conn, headers=conn.spec.headers or None) as client,
                streamable_http_client(conn.spec.url, http_client=client,
                                       max_sse_event_size=conn.max_message_bytes) as streams):
        yield streams


@asynccontextmanager
async def sse_transport(conn: Connection) -> AsyncIterator[tuple[Any, Any]]:
    url, limit = conn.spec.url, conn.max_message_bytes
    async with (http_client(conn, conn.spec.headers or None, events_capped_by_reader=True) as client,
                stream_within_origin(client, "GET", url, headers=SSE_HEADERS) as response):
        response.raise_for_status()
        if not _is_event_stream(response):
            raise ConnectionError(f"expected an event stream ({EVENT_STREAM}), got "
                                  f"{response.headers.get('content-type', 'no content type')!r}")
        read_writer, read_stream = anyio.create_memory_object_stream[SessionMessage | Exception](0)
        write_stream, write_reader = anyio.create_memory_object_stream[SessionMessage](0)

        async def reader(*, task_status: anyio.abc.TaskStatus[str] = anyio.TASK_STATUS_IGNORED) -> None:
            endpoint = None
            async with read_writer:
                try:
                    async for kind, data, size in sse_events(response.aiter_raw(), limit):
                        if kind == "endpoint" and endpoint is None:
                            endpoint = _same_origin(url, data.decode("utf-8", "replace"))
                            task_status.started(endpoint)
                        elif kind == "message" and size and endpoint is not None:  # empty: a keep-alive
                            await read_writer.send(_message(data, size, limit))
                except (httpx2.HTTPError, OSError, anyio.ClosedResourceError, anyio.BrokenResourceError):
                    pass  # the server or the session is gone: the session sees the stream end
            if endpoint is None:
                raise ConnectionError("the SSE stream ended before its endpoint event")

        async def writer(endpoint: str) -> None:
            async with write_reader:
                async for message in write_reader:
                    failure = await _post(client, endpoint, message)
                    if failure is not None and isinstance(message.message, mcp_types.JSONRPCRequest):
                        try:  # only this request fails; the stream may well be fine
                            await read_writer.send(SessionMessage(mcp_types.JSONRPCError(
                                jsonrpc="2.0", id=message.message.id, error=failure)))
                        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                            return

        async with anyio.create_task_group() as tg:
            endpoint = await tg.start(reader)
            tg.start_soon(writer, endpoint)
            try:
                yield read_stream, write_stream
            finally:
                tg.cancel_scope.cancel()


async def sse_events(chunks: AsyncIterable[bytes], limit: int) -> AsyncIterator[tuple[str, bytes, int]]:
    """Server-sent events as (type, data, size of the data); past `limit` only the data's head is kept.

    Lines end in LF or CRLF (what servers send; a lone CR is not taken for a line end).
    """
    kind, data, size = b"", bytearray(), None  # size None: no data line yet
    async for line, line_size in read_lines(chunks, limit + SSE_SLACK_BYTES):
        if line.endswith(b"\r"):
            line, line_size = line[:-1], line_size - 1
        if not line_size:  # a blank line ends the event
            if kind or size is not None:
                yield kind.decode("utf-8", "replace") or "message", bytes(data), size or 0
            kind, data, size = b"", bytearray(), None
            continue
        field, _, value = line.partition(b":")
        value = value.removeprefix(b" ")
        if field == b"event":
            kind = value
        elif field == b"data":
            if size is not None:
                data += b"\n"
            size = (0 if size is None else size + 1) + line_size - (len(line) - len(value))
            if len(data) < HEAD_BYTES or size <= limit:
                data += value
            if size > limit:
                del data[HEAD_BYTES:]
        # comments (":..."), `id` and `retry` lines are of no use to a JSON-RPC session


def _same_origin(url: str, endpoint: str) -> str:
    endpoint = urljoin(url, endpoint)
    if urlsplit(endpoint)[:2] != urlsplit(url)[:2]:  # scheme and host:port, as the SDK checks
        raise ConnectionError(f"the SSE endpoint {endpoint} is not on the origin of {url}")
    return endpoint


async def _post(client: httpx2.AsyncClient, endpoint: str, message: SessionMessage) -> mcp_types.ErrorData | None:
    """POST one message to the SSE endpoint; what went wrong, as a JSON-RPC error, or None."""
    try:
        response = await request_within_origin(
            client, "POST", endpoint,
            json=message.message.model_dump(by_alias=True, mode="json", exclude_unset=True))
        response.raise_for_status()
        return None
    except httpx2.HTTPStatusError as exc:
        return mcp_types.ErrorData(code=mcp_types.INTERNAL_ERROR,
                                   message=f"the SSE endpoint answered HTTP {exc.response.status_code}")
    except (httpx2.HTTPError, OSError) as exc:  # unreachable: the same as a closed connection
        return mcp_types.ErrorData(code=mcp_types.CONNECTION_CLOSED,
                                   message=f"posting to the SSE endpoint failed: {type(exc).__name__}: {exc}")


TRANSPORTS: dict[str, Callable[[Connection], AbstractAsyncContextManager]] = {
    "stdio": stdio_transport,
    "streamable_http": streamable_http_transport,
    "sse": sse_transport,
}
