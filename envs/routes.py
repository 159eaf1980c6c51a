"""Routing a model-visible tool name to the source that serves it, with its checks and hidden arguments.

`build_routes(sources)` runs once, when the servers have started: every tool gets a `Route` (source,
the server's own tool, a JSON Schema validator, its cache) and an OpenAI-shape schema for the prompt.

Hidden arguments (`hidden_arguments: {tool: {arg: value}}` in the manifest) are checked here against
the input schema the server declares (the tool must exist and declare the argument) and removed from
the schema the model sees (`properties` and `required`). Their values, which may name the sample
(`${sample.db_id}`), are filled into each call by whoever knows the sample, i.e. the episode
(envs.episode); they overwrite anything the model wrote under that name, so a model cannot reach another
sample's database by guessing the argument. Arguments are validated after filling, against the full
schema the server declared.

Also here: how a result is rendered as text, and the failure results the tool env builds.
"""
from __future__ import annotations

import copy
import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import jsonschema
from jsonschema.exceptions import best_match
from mcp.types import CallToolResult, Tool

from envs.cache import ResultCache
from envs.templates import refs
from rl_factory.base.types import ToolCall, ToolResult

logger = logging.getLogger("envs.tool_env")

# How each MCP content block is shown to the model; non-text blocks become short placeholders.
CONTENT_RENDERERS: dict[str, Callable[[Any], str]] = {
    "text": lambda c: c.text,
    "image": lambda c: f"[image: {c.mime_type}]",
    "audio": lambda c: f"[audio: {c.mime_type}]",
    "resource_link": lambda c: f"[resource: {c.uri}]",
    "resource": lambda c: f"[resource: {c.resource.uri}]",
}


@dataclass
class Route:
    """Where a model-visible tool name goes: its source, the source's own name, its checks.

    `hidden` maps argument names to their (unfilled) manifest values; `fixed` is the filled mapping when
    no value names the sample or episode (then calls outside an episode can fill it too), else None.
    `episodic` marks a tool of a `scope: episode` server: only an episode's own instance serves it.
    """

    source: Any
    tool: Tool
    validator: Any
    cache: ResultCache | None
    hidden: dict[str, Any] = field(default_factory=dict)
    fixed: dict[str, Any] | None = None
    episodic: bool = False


def build_routes(sources: Sequence[Any]) -> tuple[dict[str, Route], list[dict[str, Any]], list[str]]:
    """Route tool names to sources, compile their validators, strip hidden arguments; returns
    (routes, model-visible schemas, setup errors)."""
    routes: dict[str, Route] = {}
    schemas: list[dict[str, Any]] = []
    errors: list[str] = []
    for source in sources:
        spec = source.spec
        cache = ResultCache(spec.cache) if getattr(spec, "cache", None) is not None else None
        prefix = spec.tool_prefix(source.name)
        names = {t.name for t in source.tools}
        unknown = [n for n in (cache.spec.tools or []) if n not in names] if cache is not None else []
        if unknown:
            errors.append(f"{source.label}: cache.tools names {unknown}, which it does not serve")
        hidden_all = getattr(spec, "hidden_arguments", {}) or {}
        missing = sorted(set(hidden_all) - names)
        if missing:
            errors.append(f"mcpServers.{source.name}.hidden_arguments names tool {missing[0]!r}, which the server "
                          f"does not serve (its tools: {sorted(names)})")
        for tool in source.tools:
            name = prefix + tool.name
            if name in routes:
                errors.append(f"tool '{name}' is served by both {routes[name].source.label} and "
                              f"{source.label}; hide it on one with tools.exclude, or set prefix: true")
                continue
            hidden = dict(hidden_all.get(tool.name) or {})
            parameters, problem = visible_schema(tool, hidden)
            if problem:
                errors.append(f"mcpServers.{source.name}.hidden_arguments.{tool.name}: {problem}")
                continue
            use_cache = cache if cache is not None and cache.applies_to(tool.name) else None
            routes[name] = Route(source, tool, compile_validator(source.name, tool), use_cache, hidden,
                                 fixed=None if list(refs(hidden)) else hidden,
                                 episodic=getattr(spec, "scope", "shared") == "episode")
            schemas.append({"type": "function", "function": {
                "name": name, "description": tool.description or "", "parameters": parameters}})
    return routes, schemas, errors


def visible_schema(tool: Tool, hidden: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    """The input schema the model sees (hidden arguments removed), or a problem naming the argument."""
    schema = tool.input_schema or {"type": "object"}
    if not hidden:
        return schema, None
    declared = schema.get("properties") or {}
    absent = [a for a in hidden if a not in declared]
    if absent:
        return schema, (f"tool {tool.name!r} declares no argument {absent[0]!r} "
                        f"(its arguments: {sorted(declared)})")
    visible = copy.deepcopy(schema)
    visible["properties"] = {k: v for k, v in declared.items() if k not in hidden}
    if "required" in visible:
        visible["required"] = [r for r in visible["required"] if r not in hidden]
    return visible, None


def render_result(result: CallToolResult) -> str:
    """The model-visible text of a tool result: text blocks joined, structured content as JSON
    when there is no text, other blocks as `[image: image/png]`-style placeholders."""
    parts = [CONTENT_RENDERERS.get(c.type, lambda c: f"[{c.type}]")(c) for c in result.content]
    has_text = any(c.type == "text" for c in result.content)
    if not has_text and result.structured_content is not None:
        parts.insert(0, json.dumps(result.structured_content, ensure_ascii=False))
    return "\n".join(p for p in parts if p)


def failure(call: ToolCall, kind: str, message: str, server: str | None = None,
            latency_s: float = 0.0) -> ToolResult:
    # Servers often say "Error executing tool ..." already; don't stutter "Error: Error ...".
    text = message if message.lower().startswith("error") else f"Error: {message}"
    return ToolResult(call=call, text=text, error_kind=kind, server=server, latency_s=latency_s)


def argument_problem(name: str, validator: Any, arguments: Any) -> str | None:
    if not isinstance(arguments, dict):
        return f"arguments for '{name}' must be a JSON object, got {type(arguments).__name__}"
    error = best_match(validator.iter_errors(arguments)) if validator else None
    if error is None:
        return None
    where = "/".join(str(p) for p in error.absolute_path)
    return f"invalid arguments for '{name}'" + (f" at '{where}'" if where else "") + f": {error.message}"


def compile_validator(server: str, tool: Tool) -> Any:
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
