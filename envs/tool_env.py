"""ToolEnv: every tool of a manifest behind one async `call_batch`, with failures as observations.

The rollout hands over the calls a parser found in one assistant turn and gets back one
`ToolResult` per call, in order, with the text the model will see. Nothing a model can write
raises: a call that cannot be parsed, names no tool, breaks the tool's input schema, times out,
errors on the server or hits a crashed server becomes a short `Error: ...` result with an
`error_kind`, and is counted in `metrics()`.

Arguments are checked against the tool's JSON Schema (`jsonschema`) before anything is sent, so
the model gets the validator's plain message rather than a server-specific one, and bad calls
cost no round trip.

Bounds (`ToolLimits`, from `env.*`): at most `max_calls_per_turn` calls of one turn run (the rest
fail at once with a "too_many_calls" error, so a flood cannot starve other trajectories' calls);
a result's text is cut to `max_output_bytes` (its first and last bytes around a marker) before it
is kept, cached or tokenized, for every kind of source; and transports drop a message larger than
`wire_bytes` while reading it (a "too_large" error), so a runaway tool costs neither time nor
memory. Result text is also scrubbed of the server's secrets and of invalid Unicode.

Tools come from MCP servers and from plain Python functions (envs.functions); both sit behind
the same interface (`start`, `stop`, `tools`, `call_tool`), so routing, validation, caching,
errors and metrics are one code path. Servers start lazily: entering `async with` starts
nothing; the first `list_tools()` or call starts them all, once, however many tasks ask at the
same moment. A server with `prefix` shows its tools as `<prefix>__<tool>`; calls are routed back
to the server's own name (envs.routes, which also strips `hidden_arguments` from the schemas).

Episodes (envs.episode): `env.open_episode(sample)` gives one trajectory its own handle, with its own
instance of every `scope: episode` server, the hidden arguments filled from its sample, and the
environment hook (`environment`, envs.environment) if the run has one. The rollout and the reward's
`tools` call through that handle; calls made on the env itself reach only shared servers.
"""
from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any, Protocol

from mcp.types import CallToolResult, Tool

from envs.cache import ResultCache
from envs.episode import Episode, EpisodeStats, open_episode
from envs.episode_servers import EpisodeServer
from envs.function_tools import load_function_tools
from envs.limits import ToolLimits, clip_bytes
from envs.manifest import load_manifest
from envs.mcp_client import MCPServerConnection, ToolCallError, ToolEnvError
from envs.parsers.safe_json import repair_text
from envs.routes import (Route, argument_problem, build_routes, failure, render_result)  # noqa: F401 (re-export)
from envs.tool_metrics import INVALID_TOOL_KEY, LOCAL_ERROR_KINDS, ToolMetrics  # noqa: F401 (re-export)
from rl_factory.base.types import ToolCall, ToolResult

logger = logging.getLogger(__name__)

MAX_LISTED_TOOLS = 30


class ToolSource(Protocol):
    """What serves tools: an MCP server connection or a Python function (envs.functions)."""

    name: str  # the `server` of its results
    label: str  # how errors name it: "'search'" or "function 'tools.py:add'"
    spec: Any  # ServerSpec | FunctionSpec: `cache`, `tool_prefix(name)`, `redact(text)`
    tools: list[Tool]

    async def start(self) -> None: ...
    async def stop(self) -> None: ...
    async def call_tool(self, name: str, arguments: dict[str, Any]) -> CallToolResult: ...


class ToolEnv:
    """The tools of one manifest; use as `async with ToolEnv.from_manifest(p) as env`.

    Entering starts no server; `await env.list_tools()` (or the first call) does.
    """

    def __init__(self, sources: Sequence[ToolSource] = (), limits: ToolLimits | None = None,
                 environment: Any = None, probe_sample: dict | None = None):
        self.limits = limits or ToolLimits()
        self._sources = list(sources)
        self._episode_servers = [s for s in self._sources if isinstance(s, EpisodeServer)]
        self.environment = environment  # env.environment's factory (envs.environment), or None
        self.probe_sample = probe_sample  # lists the tools of servers whose launch line names the sample
        self._episodes: set[Episode] = set()  # open episodes, closed when the env stops
        self._deferred: list[Any] = []  # closed episodes' teardowns, run once no episode is open (_later)
        self._closing: set[asyncio.Task] = set()  # closed episodes' processes being stopped
        self.episode_stats = EpisodeStats()
        self._tool_metrics = ToolMetrics()
        self._routes: dict[str, Route] = {}
        self._schemas: list[dict[str, Any]] = []
        self._started = False
        self._open = False
        self._start_lock: asyncio.Lock | None = None
        self._start_error: BaseException | None = None  # a failed start is not retried per call
        self.reset_metrics()

    @classmethod
    def from_manifest(cls, manifest: str | os.PathLike | Mapping | None,
                      log_dir: str | os.PathLike | None = None, limits: ToolLimits | None = None,
                      environment: Any = None, probe_sample: dict | None = None) -> ToolEnv:
        """Build (not start) an env from a manifest path, a loaded mapping, or None for no tools.

        Args:
            manifest: see `envs.manifest.load_manifest`.
            log_dir: where stdio servers' stderr goes (`<log_dir>/<server>.log`); None keeps it
                in anonymous temporary files.
            limits: calls per turn and output bytes (default `ToolLimits()`).
            environment: the `env.environment` factory (envs.environment.load_environment), or None.
            probe_sample: a dataset row, for listing the tools of `scope: episode` servers whose
                launch line names `${sample.*}` (started once for it when the env starts).

        Raises:
            ManifestError: the manifest is missing or invalid, or a listed function cannot be
                imported.
        """
        spec = load_manifest(manifest)
        limits = limits or ToolLimits()
        kinds = {"shared": MCPServerConnection, "episode": EpisodeServer}
        servers = [kinds[s.scope](name, s, log_dir, max_message_bytes=limits.wire_bytes)
                   for name, s in spec.servers.items()]
        return cls([*servers, *load_function_tools(spec)], limits, environment, probe_sample)

    @classmethod
    def empty(cls, limits: ToolLimits | None = None) -> ToolEnv:
        """An env with no tools, for tasks without tools; every call is an unknown tool."""
        return cls(limits=limits)

    # ---- lifecycle -----------------------------------------------------------------------------

    async def __aenter__(self) -> ToolEnv:
        self._open, self._start_error = True, None  # lazy: servers start on first list_tools() or call
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    async def start(self) -> None:
        """Start every source now rather than on first use; raises ToolEnvError on failure."""
        await self.__aenter__()
        await self._ensure_started()

    async def stop(self) -> None:
        """Close the episodes still open, then stop every server concurrently (stdio children exit);
        safe to call twice."""
        self._open = False
        await asyncio.gather(*(e.close() for e in list(self._episodes)), return_exceptions=True)
        self._reap(force=True)
        await asyncio.gather(*self._closing, return_exceptions=True)
        await self._stop_sources()

    def _later(self, teardown: Any) -> None:
        """Stop a closed episode's processes in the background, once no episode is open (or once as many
        wait as `max_concurrency` episodes may be live): servers exiting by the dozen while a batch still
        runs took a third more rollout time on 2 cores (benchmarks/episodes.py). `stop` runs them all."""
        self._deferred.append(teardown)
        self._reap()

    def _reap(self, force: bool = False) -> None:
        backlog = max((s.spec.max_concurrency for s in self._episode_servers), default=0)
        if not force and self._episodes and len(self._deferred) < backlog:
            return
        for teardown in self._deferred:
            task = asyncio.ensure_future(teardown)
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)
        self._deferred = []

    async def _stop_sources(self) -> None:
        self._started = False
        await asyncio.gather(*(s.stop() for s in self._sources), return_exceptions=True)

    def log_to(self, directory: str | os.PathLike) -> None:
        """From now on keep every stdio server's stderr in `<directory>/<server>.log`, with what it has
        written so far (appended). A run starts its servers with anonymous logs (`log_dir=None`) and
        moves them into its run directory once it has passed its start-up checks."""
        for source in self._sources:
            move = getattr(source, "log_to", None)  # sources that keep logs (servers); functions have none
            if move is not None:
                move(directory)

    async def list_tools(self) -> list[dict[str, Any]]:
        """Start the servers if needed (once) and return `tools`."""
        await self._ensure_started()
        return self.tools

    async def _ensure_started(self) -> None:
        if self._started or not self._sources:
            return
        if not self._open:
            raise RuntimeError("ToolEnv is not open: use `async with ToolEnv.from_manifest(...) as env`")
        if self._start_lock is None:
            self._start_lock = asyncio.Lock()
        async with self._start_lock:  # concurrent first calls: one start, the rest wait for it
            if isinstance(self._start_error, ToolEnvError):
                raise ToolEnvError(str(self._start_error))  # each waiter gets the failure, not a retry
            if not self._started:
                await self._start_all()

    async def _start_all(self) -> None:
        """Start every source concurrently; on any failure stop them all and raise ToolEnvError."""
        for server in self._episode_servers:
            server.probe_sample = self.probe_sample
        try:
            results = await asyncio.gather(*(s.start() for s in self._sources), return_exceptions=True)
        except asyncio.CancelledError:
            await self._stop_sources()  # servers that did start must not outlive an abandoned start
            raise
        errors = [r for r in results if isinstance(r, BaseException)] or self._index()
        if errors:
            await self._stop_sources()
            unexpected = [e for e in errors if not isinstance(e, ToolEnvError | str)]
            if unexpected:
                raise unexpected[0]
            self._start_error = ToolEnvError("; ".join(str(e) for e in errors))
            raise self._start_error
        self._started = True

    def _index(self) -> list[str]:
        """Route tool names to sources and compile their validators; returns setup errors."""
        self._routes, self._schemas, errors = build_routes(self._sources)
        return errors

    # ---- what the rollout uses -----------------------------------------------------------------

    @property
    def tools(self) -> list[dict[str, Any]]:
        """OpenAI-shape schemas `{"type": "function", "function": {name, description, parameters}}`,
        `parameters` being the server's `input_schema` unchanged; ready for `apply_chat_template`.
        Known once the servers have started: `await env.list_tools()` first."""
        if self._sources and not self._started:
            raise RuntimeError("ToolEnv.tools is not known before the servers start: "
                               "use `await env.list_tools()`")
        return list(self._schemas)

    @property
    def tool_names(self) -> list[str]:
        return [s["function"]["name"] for s in self.tools]

    def server_of(self, tool_name: str) -> str | None:
        route = self._routes.get(tool_name)
        return route.source.name if route else None

    @property
    def episodic(self) -> bool:
        """Whether an episode holds state of its own (a `scope: episode` server or an environment), so
        that a reward must score a trajectory before its episode closes."""
        return bool(self._episode_servers) or self.environment is not None

    async def open_episode(self, sample: dict) -> Episode:
        """One trajectory's own handle on the tools (envs.episode); raises EpisodeError for this sample."""
        return await open_episode(self, sample)

    @asynccontextmanager
    async def episode(self, sample: dict):
        """`async with env.episode(sample) as ep`: opened, and closed however the block ends."""
        episode = await open_episode(self, sample)
        try:
            yield episode
        finally:
            await episode.close()

    async def call_batch(self, calls: Sequence[ToolCall]) -> list[ToolResult]:
        """Run one turn's calls concurrently (each server bounds its own in-flight calls); results in
        order. Calls past `limits.max_calls_per_turn` are not run: each gets a "too_many_calls" error.
        Only shared servers answer here; an episode's own servers answer `episode.call_batch`."""
        return await self._call_batch(calls, None, None)

    async def _call_batch(self, calls: Sequence[ToolCall], routes: dict | None, fills: dict | None
                          ) -> list[ToolResult]:
        if len(calls) == 1:  # the common turn: no task for gather to make and schedule (~20 us)
            return [await self._call_routed(calls[0], routes, fills)]
        cap = self.limits.max_calls_per_turn
        results = list(await asyncio.gather(*(self._call_routed(c, routes, fills) for c in calls[:cap])))
        for call in calls[cap:]:
            result = failure(call, "too_many_calls", f"not run: {len(calls)} tool calls in one turn, at most "
                                                     f"{cap} run per turn (env.max_calls_per_turn)")
            self._record(result)
            results.append(result)
        return results

    async def call(self, call: ToolCall, record: bool = True) -> ToolResult:
        """Run one call; every failure comes back as a ToolResult with `error_kind` set.

        `record=False` keeps the call out of the `tool/*` metrics (a reward's own calls are not the agent's).

        Raises:
            ToolEnvError: this is the first call and a server cannot start (a setup error,
                not the model's).
        """
        return await self._call_routed(call, None, None, record)

    async def _call_routed(self, call: ToolCall, routes: dict | None, fills: dict | None,
                           record: bool = True) -> ToolResult:
        if not self._started:  # checked inline: this is the hot path of every call
            await self._ensure_started()
        result = await self._call(call, self._routes if routes is None else routes, fills)
        if record:
            self._record(result)
        return result

    async def _call(self, call: ToolCall, routes: dict[str, Route], fills: dict | None) -> ToolResult:
        if call.error is not None:
            return failure(call, "parse", f"could not parse the tool call: {call.error}")
        route = routes.get(call.name)
        if route is None:
            return failure(call, "unknown_tool", self._unknown_tool_message(call.name))
        arguments = call.arguments if call.arguments is not None else {}
        if route.hidden and isinstance(arguments, dict):
            hidden = fills.get(call.name) if fills is not None else route.fixed
            if hidden is None:
                return failure(call, "server_error", f"tool '{call.name}' fills arguments from the sample "
                                                     "(hidden_arguments): call it through an episode")
            arguments = {**arguments, **hidden}  # the sample's values win over anything the model wrote
        problem = argument_problem(call.name, route.validator, arguments)
        if problem:
            return failure(call, "bad_arguments", problem, server=route.source.name)
        if route.cache is None:
            return await self._dispatch(call, route, arguments)
        key = ResultCache.key(route.tool.name, arguments)
        outcome = await route.cache.run(key, lambda: self._dispatch(call, route, arguments))
        if isinstance(outcome, str):  # a hit: the text of an earlier successful call
            return ToolResult(call=call, text=outcome, server=route.source.name, cached=True)
        return outcome

    async def _dispatch(self, call: ToolCall, route: Route, arguments: dict[str, Any]) -> ToolResult:
        source = route.source
        start = time.perf_counter()
        try:
            result = await source.call_tool(route.tool.name, arguments)
        except ToolCallError as err:
            return failure(call, err.kind, str(err), source.name, time.perf_counter() - start)
        latency = time.perf_counter() - start
        try:
            text = render_result(result)
        except (ValueError, RecursionError) as err:  # e.g. structured content nested past json's limit
            return failure(call, "server_error", f"tool '{call.name}' returned a result that cannot be "
                                                 f"shown: {type(err).__name__}", source.name, latency)
        # A server may echo its credentials (in an error or a result): they never reach the model.
        text = clip_bytes(source.spec.redact(repair_text(text)), self.limits.max_output_bytes)
        if result.is_error:
            return failure(call, "server_error", text or f"tool '{call.name}' reported an error",
                           source.name, latency)
        return ToolResult(call=call, text=text, server=source.name, latency_s=latency)

    def _unknown_tool_message(self, name: str) -> str:
        if not self._routes:
            return f"unknown tool '{name}'; no tools are available"
        names = list(self._routes)
        listed = ", ".join(names[:MAX_LISTED_TOOLS]) + (", ..." if len(names) > MAX_LISTED_TOOLS else "")
        return f"unknown tool '{name}'; available tools: {listed}"

    # ---- metrics (envs.tool_metrics) ----------------------------------------------------------

    def reset_metrics(self) -> None:
        """Zero the cumulative counters (e.g. at each logging step)."""
        self._tool_metrics.reset()
        self.episode_stats.reset()
        for server in self._episode_servers:
            server.pool_hits = 0

    def metrics(self) -> dict[str, float]:
        """Cumulative counters since the last reset: the `tool/*` keys of `ToolMetrics.metrics` and, for a
        run whose episodes hold state (`episodic`), `episode/opened`, `episode/failed`, `episode/open_s/mean`
        and `/max`, `episode/close_s/mean` and `episode/pool_hits` (episodes that took a warm-pool instance).
        """
        out = self._tool_metrics.metrics()
        if self.episodic:
            out.update(self.episode_stats.metrics(sum(s.pool_hits for s in self._episode_servers)))
        return out

    def _record(self, result: ToolResult) -> None:
        self._tool_metrics.record(result, self._routes)
