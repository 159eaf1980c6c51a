"""ToolEnv: every tool of a manifest behind one async `call_batch`, with failures as observations.

The rollout hands over the calls a parser found in one assistant turn and gets back one
`ToolResult` per call, in order, with the text the model will see. Nothing a model can write
raises: a call that cannot be parsed, names no tool, breaks the tool's input schema, times out,
errors on the server or hits a crashed server becomes a short `Error: ...` result with an
`error_kind`, and is counted in `metrics()`.

Arguments are checked against the tool's JSON Schema (`jsonschema`) before anything is sent, so
the model gets the validator's plain message rather than a server-specific one, and bad calls
cost no round trip.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jsonschema
from jsonschema.exceptions import best_match
from mcp.types import CallToolResult, Tool

from envs.manifest import load_manifest
from envs.mcp_client import MCPServerConnection, ToolCallError, ToolEnvError
from rl_factory.types import ToolCall, ToolResult

logger = logging.getLogger(__name__)

# Failures decided here, before any server is contacted: they carry no latency.
LOCAL_ERROR_KINDS = ("parse", "unknown_tool", "bad_arguments")
INVALID_TOOL_KEY = "_invalid"  # metrics bucket for names no server serves (keeps key count bounded)
MAX_LISTED_TOOLS = 30

# How each MCP content block is shown to the model; non-text blocks become short placeholders.
CONTENT_RENDERERS: dict[str, Callable[[Any], str]] = {
    "text": lambda c: c.text,
    "image": lambda c: f"[image: {c.mime_type}]",
    "audio": lambda c: f"[audio: {c.mime_type}]",
    "resource_link": lambda c: f"[resource: {c.uri}]",
    "resource": lambda c: f"[resource: {c.resource.uri}]",
}


class ToolEnv:
    """The tools of all servers of one manifest; use as `async with ToolEnv.from_manifest(p) as env`."""

    def __init__(self, connections: Sequence[MCPServerConnection] = ()):
        self._connections = list(connections)
        self._routes: dict[str, tuple[MCPServerConnection, Tool]] = {}
        self._validators: dict[str, Any] = {}
        self._schemas: list[dict[str, Any]] = []
        self._started = False
        self.reset_metrics()

    @classmethod
    def from_manifest(cls, manifest: str | os.PathLike | Mapping | None,
                      log_dir: str | os.PathLike | None = None) -> ToolEnv:
        """Build (not start) an env from a manifest path, a loaded mapping, or None for no tools.

        Args:
            manifest: see `envs.manifest.load_manifest`.
            log_dir: where stdio servers' stderr goes (`<log_dir>/<server>.log`); None keeps it
                in anonymous temporary files.

        Raises:
            ManifestError: the manifest is missing or invalid.
        """
        spec = load_manifest(manifest)
        return cls([MCPServerConnection(name, s, log_dir) for name, s in spec.servers.items()])

    @classmethod
    def empty(cls) -> ToolEnv:
        """An env with no tools, for tasks without tools; every call is an unknown tool."""
        return cls()

    # ---- lifecycle -----------------------------------------------------------------------------

    async def __aenter__(self) -> ToolEnv:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    async def start(self) -> None:
        """Start every server concurrently; on any failure stop them all and raise ToolEnvError."""
        try:
            results = await asyncio.gather(*(c.start() for c in self._connections),
                                           return_exceptions=True)
        except asyncio.CancelledError:
            await self.stop()  # servers that did start must not outlive an abandoned start
            raise
        errors = [r for r in results if isinstance(r, BaseException)] or self._index()
        if errors:
            await self.stop()
            unexpected = [e for e in errors if not isinstance(e, ToolEnvError | str)]
            if unexpected:
                raise unexpected[0]
            raise ToolEnvError("; ".join(str(e) for e in errors))
        self._started = True

    async def stop(self) -> None:
        """Stop every server concurrently (stdio children exit); safe to call twice."""
        self._started = False
        await asyncio.gather(*(c.stop() for c in self._connections), return_exceptions=True)

    def _index(self) -> list[str]:
        """Route tool names to servers and compile their validators; returns duplicate errors."""
        self._routes, self._validators, self._schemas, errors = {}, {}, [], []
        for conn in self._connections:
            for tool in conn.tools:
                if tool.name in self._routes:
                    other = self._routes[tool.name][0].name
                    errors.append(f"tool '{tool.name}' is served by both '{other}' and '{conn.name}'; "
                                  f"hide it on one with tools.exclude")
                    continue
                self._routes[tool.name] = (conn, tool)
                self._validators[tool.name] = _compile_validator(conn.name, tool)
                self._schemas.append({"type": "function", "function": {
                    "name": tool.name, "description": tool.description or "",
                    "parameters": tool.input_schema}})
        return errors

    # ---- what the rollout uses -----------------------------------------------------------------

    @property
    def tools(self) -> list[dict[str, Any]]:
        """OpenAI-shape schemas `{"type": "function", "function": {name, description, parameters}}`,
        `parameters` being the server's `input_schema` unchanged; ready for `apply_chat_template`."""
        return list(self._schemas)

    @property
    def tool_names(self) -> list[str]:
        return list(self._routes)

    def server_of(self, tool_name: str) -> str | None:
        route = self._routes.get(tool_name)
        return route[0].name if route else None

    async def call_batch(self, calls: Sequence[ToolCall]) -> list[ToolResult]:
        """Run all calls concurrently (each server bounds its own in-flight calls); results in order."""
        return list(await asyncio.gather(*(self.call(c) for c in calls)))

    async def call(self, call: ToolCall) -> ToolResult:
        """Run one call; every failure comes back as a ToolResult with `error_kind` set."""
        if self._connections and not self._started:
            raise RuntimeError("ToolEnv is not started: use `async with ToolEnv.from_manifest(...) as env`")
        result = await self._call(call)
        self._record(result)
        return result

    async def _call(self, call: ToolCall) -> ToolResult:
        if call.error is not None:
            return _failure(call, "parse", f"could not parse the tool call: {call.error}")
        route = self._routes.get(call.name)
        if route is None:
            return _failure(call, "unknown_tool", self._unknown_tool_message(call.name))
        conn, _ = route
        arguments = call.arguments if call.arguments is not None else {}
        problem = self._argument_problem(call.name, arguments)
        if problem:
            return _failure(call, "bad_arguments", problem, server=conn.name)
        start = time.perf_counter()
        try:
            result = await conn.call_tool(call.name, arguments)
        except ToolCallError as err:
            return _failure(call, err.kind, str(err), conn.name, time.perf_counter() - start)
        latency = time.perf_counter() - start
        text = render_result(result)
        if result.is_error:
            return _failure(call, "server_error", text or f"tool '{call.name}' reported an error",
                            conn.name, latency)
        return ToolResult(call=call, text=text, server=conn.name, latency_s=latency)

    def _unknown_tool_message(self, name: str) -> str:
        if not self._routes:
            return f"unknown tool '{name}'; no tools are available"
        names = list(self._routes)
        listed = ", ".join(names[:MAX_LISTED_TOOLS]) + (", ..." if len(names) > MAX_LISTED_TOOLS else "")
        return f"unknown tool '{name}'; available tools: {listed}"

    def _argument_problem(self, name: str, arguments: Any) -> str | None:
        validator = self._validators.get(name)
        if not isinstance(arguments, dict):
            return f"arguments for '{name}' must be a JSON object, got {type(arguments).__name__}"
        error = best_match(validator.iter_errors(arguments)) if validator else None
        if error is None:
            return None
        where = "/".join(str(p) for p in error.absolute_path)
        return f"invalid arguments for '{name}'" + (f" at '{where}'" if where else "") + f": {error.message}"

    # ---- metrics -------------------------------------------------------------------------------

    def reset_metrics(self) -> None:
        """Zero the cumulative counters (e.g. at each logging step)."""
        self._counts: Counter[str] = Counter()
        self._latency_sum, self._latency_n, self._latency_max = 0.0, 0, 0.0

    def metrics(self) -> dict[str, float]:
        """Cumulative counters since the last reset.

        Keys: `tool/calls`, `tool/success_rate`, `tool/errors/<kind>`, `tool/<name>/calls`,
        `tool/<name>/errors/<kind>` (names no server serves are pooled as `_invalid`),
        `tool/latency_s/mean` and `/max` over calls that reached a server.
        """
        out = {k: float(v) for k, v in self._counts.items() if k != "tool/successes"}
        out["tool/calls"] = float(self._counts["tool/calls"])
        if self._counts["tool/calls"]:
            out["tool/success_rate"] = self._counts["tool/successes"] / self._counts["tool/calls"]
        if self._latency_n:
            out["tool/latency_s/mean"] = self._latency_sum / self._latency_n
            out["tool/latency_s/max"] = self._latency_max
        return out

    def _record(self, result: ToolResult) -> None:
        name = result.call.name if result.call.name in self._routes else INVALID_TOOL_KEY
        self._counts["tool/calls"] += 1
        self._counts[f"tool/{name}/calls"] += 1
        if result.ok:
            self._counts["tool/successes"] += 1
        else:
            self._counts[f"tool/errors/{result.error_kind}"] += 1
            self._counts[f"tool/{name}/errors/{result.error_kind}"] += 1
        if result.error_kind not in LOCAL_ERROR_KINDS:
            self._latency_sum += result.latency_s
            self._latency_n += 1
            self._latency_max = max(self._latency_max, result.latency_s)


def render_result(result: CallToolResult) -> str:
    """The model-visible text of a tool result: text blocks joined, structured content as JSON
    when there is no text, other blocks as `[image: image/png]`-style placeholders."""
    parts = [CONTENT_RENDERERS.get(c.type, lambda c: f"[{c.type}]")(c) for c in result.content]
    has_text = any(c.type == "text" for c in result.content)
    if not has_text and result.structured_content is not None:
        parts.insert(0, json.dumps(result.structured_content, ensure_ascii=False))
    return "\n".join(p for p in parts if p)


def _failure(call: ToolCall, kind: str, message: str, server: str | None = None,
             latency_s: float = 0.0) -> ToolResult:
    # Servers often say "Error executing tool ..." already; don't stutter "Error: Error ...".
    text = message if message.lower().startswith("error") else f"Error: {message}"
    return ToolResult(call=call, text=text, error_kind=kind, server=server, latency_s=latency_s)


def _compile_validator(server: str, tool: Tool) -> Any:
    """A jsonschema validator for the tool's input schema, or None (with a warning) if the
    schema itself is invalid: the server is then the only judge of the arguments."""
    schema = tool.input_schema or {"type": "object"}
    cls = jsonschema.validators.validator_for(schema)
    try:
        cls.check_schema(schema)
    except jsonschema.SchemaError as err:
        logger.warning("server %r: tool %r has an invalid input schema (%s); not validating its "
                       "arguments", server, tool.name, err.message)
        return None
    return cls(schema)
