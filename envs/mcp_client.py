"""One long-lived, concurrently usable connection to one MCP server.

anyio requires a transport's and a session's context managers to be entered and exited in the
same task, so each connection runs one *owner task* that opens the transport (stdio, streamable
HTTP or SSE), initializes the session, lists the tools and then parks until `stop()`. Any other
task may `call_tool` on that session concurrently: the SDK matches responses by JSON-RPC id, so
one session serves many in-flight calls (bounded here by `max_concurrency`).

Failures never escape as transport exceptions: `call_tool` raises `ToolCallError(kind, message)`
with kind "timeout", "server_error", "too_large" (a message past the byte cap, see envs.transports)
or "crashed", which the tool env turns into a tool message. Starting (spawn or connect, the SSE
endpoint event, initialize, list_tools) has one deadline, `startup_timeout_s`, restarts included.
A crashed server fails fast: the calls in flight return "crashed" at once (so does the next
call if the server died while idle: that is when we learn of it); the call after that restarts
the server as its `restart` policy says (manifest.RestartPolicy: first
restart at once, then `backoff_s`, doubling up to `max_backoff_s`, all reset by a successful
call; at most `max_restarts` in a row; `restart: never` leaves it down). Calls are never retried,
since a tool may have side effects.

Whatever a server writes to stdout that is not JSON-RPC (a stray print, a banner, bytes that are
not UTF-8) is logged by the SDK and skipped: we decode with errors="replace", so bad bytes cannot
kill the reader. Messages we print or log pass through `spec.redact` (no secrets).

A stdio server's stderr goes to `<log_dir>/<server>.log`, or to an anonymous temporary file when
no log dir is given. When the server fails to start, the error quotes its last `STDERR_TAIL_LINES`
lines whole (a traceback's end is the exception and its hint) on the lines after the first, and
names the log file; an anonymous log is first kept as `<tmp>/rl_factory-tool-logs/<server>-<pid>.log`
so that there is a file to name. `log_to` moves the log into a directory later (what it wrote so far
included), so a run can start its servers before it writes anything into its run directory.
"""
from __future__ import annotations

import asyncio
import logging
import os
import re
import shutil
import tempfile
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from pathlib import Path
from typing import IO, Any

import anyio
from mcp import ClientSession, MCPError
from mcp.types import CallToolResult, PaginatedRequestParams, Tool

from envs.manifest import ServerSpec, describe_transport
from envs.transports import TOO_LARGE, TRANSPORTS
from rl_factory.base.errors import UserError

logger = logging.getLogger(__name__)

STOP_TIMEOUT_S = 10.0  # the SDK's stdio shutdown is bounded by ~6 s (close stdin, TERM, KILL)
STDERR_TAIL_LINES = 20  # lines of a server's stderr quoted when it fails to start
STDERR_TAIL_BYTES = 64 * 1024  # read from the log's end to find them
# JSON-RPC codes the SDK raises on the client side (mcp_types.CONNECTION_CLOSED / REQUEST_TIMEOUT).
CONNECTION_CLOSED, REQUEST_TIMEOUT = -32000, -32001
# How the SDK's and our own byte caps word a dropped message (httpx2 SSEError, envs.transports).
OVER_BYTE_LIMIT = re.compile(r"exceeded the \d+ byte limit")


class ToolEnvError(UserError, RuntimeError):
    """The tool environment cannot be set up (a server did not start, two serve one tool, ...)."""


class ServerStartError(ToolEnvError):
    """An MCP server could not be started or did not complete the MCP handshake."""


class ToolCallError(Exception):
    """A call that reached no tool result; `kind` is a ToolResult.error_kind."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


class MCPServerConnection:
    """A started MCP server and its session; `tools` is the filtered tool list of the server.

    Start, call and stop it from one event loop (the owner task lives in that loop).
    """

    def __init__(self, name: str, spec: ServerSpec, log_dir: str | os.PathLike | None = None,
                 max_message_bytes: int = 16 << 20):
        self.name = name
        self.max_message_bytes = max_message_bytes  # a larger message is dropped as it is read
        self.label = f"'{name}'"  # how errors that name a tool's source name this server
        self.spec = spec
        self.tools: list[Tool] = []
        self._log_dir = Path(log_dir) if log_dir is not None else None
        self._errlog: IO[bytes] | None = None
        self._semaphore: asyncio.Semaphore | None = None  # made in start(), inside the running loop
        self._restart_lock: asyncio.Lock | None = None
        self._session: ClientSession | None = None
        self._owner: asyncio.Task | None = None
        self._stop_event = asyncio.Event()
        self._generation = 0  # bumped per (re)start so a late failure cannot blame a new session
        self._crash_reason: str | None = None  # short, model-readable; None while healthy
        self._start_cause = ""
        self._restart_delay_s = 0.0
        self._restarts_in_a_row = 0
        self._next_restart_at = 0.0
        self._closed = False

    # ---- lifecycle -----------------------------------------------------------------------------

    async def start(self) -> None:
        """Start the server and complete the handshake; raises ServerStartError on any failure."""
        if self._errlog is None and self.spec.transport == "stdio":
            self._errlog = self._open_errlog()
        # Fresh primitives: asyncio binds them to the loop that first waits on them.
        self._semaphore = asyncio.Semaphore(self.spec.max_concurrency)
        self._restart_lock = asyncio.Lock()
        self._closed = False
        await self._start_owner()

    async def stop(self) -> None:
        """Close the session and the transport (the stdio child exits); safe to call twice."""
        self._closed = True
        await self._stop_owner()
        if self._errlog is not None:
            self._errlog.close()
            self._errlog = None

    async def _start_owner(self) -> None:
        self._generation += 1
        self._stop_event = asyncio.Event()
        self._crash_reason = None
        ready: asyncio.Future = asyncio.get_running_loop().create_future()
        self._owner = owner = asyncio.create_task(self._own(ready, self._generation),
                                                  name=f"mcp-server-{self.name}")
        try:
            # One deadline for all of it, the transport's own setup included (an SSE server that never
            # sends its endpoint event, a process that never answers initialize).
            done, _ = await asyncio.wait({ready}, timeout=self.spec.startup_timeout_s)
        except asyncio.CancelledError:
            # Our caller gave up mid-handshake: take the half-started server down with it (a cancelled
            # `ready` tells the owner nobody waits for its report: a warm pool's start cancelled at shutdown).
            ready.cancel()
            owner.cancel()
            await asyncio.gather(owner, return_exceptions=True)
            raise
        if not done:
            ready.cancel()  # the owner sees it cancelled and reports to no one
            owner.cancel()
            await asyncio.gather(owner, return_exceptions=True)
            self._start_cause = f"not ready within startup_timeout_s={self.spec.startup_timeout_s:g}s"
            raise ServerStartError(self._start_message(self._start_cause))
        ready.result()

    async def _stop_owner(self) -> None:
        owner, self._owner = self._owner, None
        self._session = None
        if owner is None or owner.done():
            return
        self._stop_event.set()
        try:
            await asyncio.wait_for(asyncio.shield(owner), STOP_TIMEOUT_S)
        except TimeoutError:
            owner.cancel()
            await asyncio.gather(owner, return_exceptions=True)

    async def _own(self, ready: asyncio.Future, generation: int) -> None:
        """The owner task: enters and exits the transport and session, so anyio stays happy."""
        try:
            async with AsyncExitStack() as stack:
                read, write = await stack.enter_async_context(self._open_transport())
                session = await stack.enter_async_context(ClientSession(read, write))
                await session.initialize()
                self.tools = self._filter(await _list_all_tools(session))
                self._session = session
                ready.set_result(None)
                await self._stop_event.wait()
        except BaseException as exc:  # noqa: BLE001 - the owner reports, it never propagates
            if ready.cancelled():
                return  # start() was abandoned and cancelled us: nobody to tell
            if not ready.done():
                ready.set_exception(ServerStartError(self._start_failure(exc)))
            elif not self._stop_event.is_set():
                self._mark_crashed(generation, _root_cause(exc))
        finally:
            if generation == self._generation:
                self._session = None

    def _open_transport(self) -> AbstractAsyncContextManager:
        return TRANSPORTS[self.spec.transport](self)

    def log_to(self, directory: str | os.PathLike) -> None:
        """Keep this server's stderr in `<directory>/<name>.log` from now on, after what it wrote so far.

        The log is appended to (a resumed run's log reads on). Synchronous, so no stderr line can fall
        between the copy and the switch: the pump writes to whichever file `_errlog` is.
        """
        old, self._log_dir = self._errlog, Path(directory)
        if old is None or old.closed:  # not started (or not stdio): opened in the new place at start
            return
        new = self._open_errlog()
        if os.path.sameopenfile(old.fileno(), new.fileno()):
            new.close()
            return
        old.flush()
        old.seek(0)
        shutil.copyfileobj(old, new)
        new.flush()
        self._errlog = new
        old.close()

    def _open_errlog(self) -> IO[bytes]:
        if self._log_dir is None:
            return tempfile.TemporaryFile()  # anonymous: vanishes on close, still readable for errors
        self._log_dir.mkdir(parents=True, exist_ok=True)
        # a+: appended by the child, read back by us for the stderr tail of an error message.
        return open(self._log_dir / f"{self.name}.log", "a+b")

    def _filter(self, tools: list[Tool]) -> list[Tool]:
        names = {t.name for t in tools}
        missing = [n for n in self.spec.tools.include or [] if n not in names]
        if missing:
            raise ServerStartError(f"mcpServers.{self.name}.tools.include names {missing}, but the "
                                   f"server has only {sorted(names)}")
        return [t for t in tools if self.spec.tools.keeps(t.name)]

    # ---- calls ---------------------------------------------------------------------------------

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> CallToolResult:
        """Call one tool; raises ToolCallError("timeout" | "server_error" | "crashed")."""
        session, generation = await self._live_session()
        async with self._semaphore:
            try:
                result = await session.call_tool(name, arguments,
                                                  read_timeout_seconds=self.spec.timeout_s)
            except asyncio.CancelledError:
                # A dying HTTP transport cancels its waiters; only a cancel *we* asked for propagates.
                if asyncio.current_task().cancelling():
                    raise
                self._mark_crashed(generation, "connection lost")
                raise ToolCallError("crashed", self._crashed_message()) from None
            except Exception as exc:  # noqa: BLE001 - every failure becomes a tool message
                kind = _classify(exc)
                if kind == "crashed":
                    self._mark_crashed(generation, _root_cause(exc))
                    raise ToolCallError(kind, self._crashed_message()) from None
                if kind == "timeout":
                    raise ToolCallError(kind, f"tool '{name}' timed out after "
                                              f"{self.spec.timeout_s:g}s") from None
                if kind == "too_large":
                    raise ToolCallError(kind, f"tool '{name}' returned too much: {_leaf(exc)}") from None
                raise ToolCallError(kind, f"tool '{name}' failed: "
                                          f"{self.spec.redact(_root_cause(exc))}") from None
        self._restart_delay_s, self._restarts_in_a_row = 0.0, 0
        if not isinstance(result, CallToolResult):
            raise ToolCallError("server_error", f"tool '{name}' returned {type(result).__name__}")
        return result

    async def _live_session(self) -> tuple[ClientSession, int]:
        if self._session is not None and self._crash_reason is None:
            return self._session, self._generation
        if self._closed or self._owner is None and self._crash_reason is None:
            raise ToolCallError("crashed", f"tool server '{self.name}' is not running")
        async with self._restart_lock:  # one restart, however many calls notice the crash
            if self._session is not None and self._crash_reason is None:
                return self._session, self._generation
            policy = self.spec.restart
            if policy.max_restarts is not None and self._restarts_in_a_row >= policy.max_restarts:
                why = ("restart: never" if policy.max_restarts == 0
                       else f"gave up after {policy.max_restarts} restarts in a row")
                raise ToolCallError("crashed", self._crashed_message(f"; not restarted ({why})"))
            wait_s = self._next_restart_at - asyncio.get_running_loop().time()
            if wait_s > 0:
                raise ToolCallError("crashed", self._crashed_message(f"; restarting in {wait_s:.1f}s"))
            await self._restart()
            return self._session, self._generation

    async def _restart(self) -> None:
        reason = self._crash_reason
        logger.warning("restarting MCP server %r after: %s", self.name, reason)
        policy = self.spec.restart
        self._restart_delay_s = min(max(policy.backoff_s, 2 * self._restart_delay_s), policy.max_backoff_s)
        self._restarts_in_a_row += 1
        await self._stop_owner()
        try:
            await self._start_owner()
        except ServerStartError as err:
            logger.warning("restart of MCP server %r failed: %s", self.name, err)  # err is redacted
            self._crash_reason = f"restart failed: {self._start_cause}"
            self._next_restart_at = asyncio.get_running_loop().time() + self._restart_delay_s
            raise ToolCallError("crashed", self._crashed_message()) from None

    def _mark_crashed(self, generation: int, reason: str) -> None:
        if generation != self._generation or self._crash_reason is not None:
            return
        self._crash_reason = self.spec.redact(reason)
        self._next_restart_at = asyncio.get_running_loop().time() + self._restart_delay_s
        tail = self._stderr_tail(last_line=True)
        logger.warning("MCP server %r crashed: %s%s", self.name, self._crash_reason,
                       f" | last stderr line: {tail}" if tail else "")

    def _crashed_message(self, suffix: str = "") -> str:
        return f"tool server '{self.name}' crashed ({self._crash_reason or 'connection lost'}){suffix}"

    # ---- diagnostics ---------------------------------------------------------------------------

    def _start_failure(self, exc: BaseException) -> str:
        if isinstance(_leaf(exc), ServerStartError):
            self._start_cause = str(_leaf(exc))
            return self._start_cause
        self._start_cause = self.spec.redact(_root_cause(exc))
        return self._start_message(self._start_cause)

    def _start_message(self, cause: str) -> str:
        """The start-up error: one line, then the server's last stderr lines (whole) and where its log is."""
        head = f"MCP server '{self.name}' ({describe_transport(self.spec)}) failed to start: {cause}"
        tail = self._stderr_tail()
        if not tail:
            return head
        where = self._kept_log()
        shown = len(tail.splitlines())
        return (f"{head}\n  its stderr, last {shown} line(s)" + (f" (all of it: {where})" if where else "") + ":\n"
                + "\n".join(f"    {line}" for line in tail.splitlines()))

    def _kept_log(self) -> str:
        """The path of this server's stderr log; an anonymous one is copied to a temp file first."""
        if self._log_dir is not None:
            return str((self._log_dir / f"{self.name}.log").resolve())
        if self._errlog is None or self._errlog.closed:
            return ""
        try:
            keep = Path(tempfile.gettempdir()) / "rl_factory-tool-logs"
            keep.mkdir(parents=True, exist_ok=True)
            path = keep / f"{self.name}-{os.getpid()}.log"
            self._errlog.flush()
            self._errlog.seek(0)
            path.write_bytes(self.spec.redact(self._errlog.read().decode("utf-8", "replace")).encode())
            return str(path)
        except OSError:  # diagnostics must never stand in the way of reporting the failure
            return ""

    def _stderr_tail(self, last_line: bool = False) -> str:
        """The last whole lines of a stdio server's stderr log ('' for HTTP servers or an empty log)."""
        if self._errlog is None or self._errlog.closed:
            return ""
        fd = self._errlog.fileno()
        try:
            size = os.fstat(fd).st_size
            start = max(0, size - STDERR_TAIL_BYTES)
            text = os.pread(fd, STDERR_TAIL_BYTES, start)
        except OSError:  # diagnostics must never stand in the way of reporting the failure
            return ""
        lines = self.spec.redact(text.decode("utf-8", "replace")).rstrip().splitlines()
        if start > 0:
            lines = lines[1:]  # the read began mid-line: that line is not whole
        lines = [line for line in lines if line.strip()]
        return (lines[-1] if last_line else "\n".join(lines[-STDERR_TAIL_LINES:])) if lines else ""


# ---- helpers -----------------------------------------------------------------------------------


async def _list_all_tools(session: ClientSession) -> list[Tool]:
    tools, cursor = [], None
    while True:
        page = await session.list_tools(params=PaginatedRequestParams(cursor=cursor) if cursor else None)
        tools.extend(page.tools)
        cursor = page.next_cursor
        if not cursor:
            return tools


def _classify(exc: BaseException) -> str:
    """Map a failed call's exception to a ToolResult.error_kind."""
    if isinstance(exc, MCPError):
        if exc.code == TOO_LARGE or OVER_BYTE_LIMIT.search(str(exc)):
            return "too_large"
        return {CONNECTION_CLOSED: "crashed", REQUEST_TIMEOUT: "timeout"}.get(exc.code, "server_error")
    if _is_timeout(exc):
        return "timeout"
    # Transport teardown surfaces as anyio stream errors, OS errors or (nested) exception groups.
    dead = (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream, OSError,
            BaseExceptionGroup)
    return "crashed" if isinstance(exc, dead) else "server_error"


def _is_timeout(exc: BaseException) -> bool:
    return isinstance(_leaf(exc), TimeoutError)


def _leaf(exc: BaseException) -> BaseException:
    """The first non-cancellation exception inside (nested) exception groups."""
    while isinstance(exc, BaseExceptionGroup):
        inner = [e for e in exc.exceptions if not isinstance(e, asyncio.CancelledError)]
        exc = (inner or list(exc.exceptions))[0]
    return exc


def _root_cause(exc: BaseException) -> str:
    leaf = _leaf(exc)
    text = str(leaf).strip()
    return f"{type(leaf).__name__}: {text}" if text else type(leaf).__name__
