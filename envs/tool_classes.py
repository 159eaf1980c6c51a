"""Tool classes as tools: qwen-agent's `BaseTool` (RL-Factory's tools) and Agent-R1's, under `functions`.

    functions:
      - my_tools.py:WordCount                     # a class (or an instance) with the interface below
      - {function: my_pkg.tools:Search, cfg: {top_k: 3}, timeout_s: 5}
      - qwen-agent:code_interpreter               # a tool registered with qwen-agent's @register_tool

Two interfaces are recognised by their methods, so neither package has to be installed for a class that
merely has the same shape (qwen-agent is the `qwen-agent` extra, needed only for `qwen-agent:<name>`):

- **qwen-agent** (`qwen_agent.tools.base.BaseTool`): class attributes `name`, `description` and
  `parameters`, a JSON schema or qwen-agent's older list of `{name, type, description, required}`
  (turned into a JSON schema here); built as `Tool(cfg)` (`Tool()` without `cfg`); `call(params, **kw)`
  gets the arguments as a JSON string, as qwen-agent's agents and RL-Factory pass them, and returns a
  string, a list (strings, or content items with `text`; an image becomes a placeholder) or anything
  JSON can write.
- **Agent-R1** (`agent_r1.tool.base.BaseTool`): `name`, `description`, `parameters` (a JSON schema); built as
  `Tool()` (`Tool(**cfg)` with `cfg`); `async execute(args: dict, **kw) -> (response, reward, extra_info)`,
  called with `tools_kwargs={}`; the response is a string, or has `text` (an attribute or a key).
  Not supported: the per-row `tools_kwargs` Agent-R1's env passes (a tool that needs the row's data
  raises, and the model sees the error: score such things in the reward instead), and the tool's own
  `reward` and `extra_info`, which are dropped (Agent-R1 sums tool rewards into its step reward).

Either runs exactly like a function tool (envs.functions): arguments checked against the schema first,
`timeout_s`, `max_concurrency`, a sync `call` on a daemon thread, an exception shown to the model as
`Error executing tool <name>: ...`, the env's output cap and error kinds.
"""
from __future__ import annotations

import inspect
import json
from typing import Any

from mcp.types import CallToolResult, TextContent, Tool

from envs.functions import FunctionTool, _in_daemon_thread
from envs.manifest import FunctionSpec, ManifestError
from envs.manifest_formats import QWEN_AGENT_TARGET  # `functions: ["qwen-agent:<registered name>"]`


def is_tool_object(obj: Any) -> bool:
    """Whether `obj` (a class or an instance) has one of the two tool interfaces."""
    return _interface(obj) is not None


def _interface(obj: Any) -> str | None:
    if inspect.isfunction(obj) or inspect.ismethod(obj) or obj is None:
        return None
    if not all(hasattr(obj, a) for a in ("name", "description", "parameters")):
        return None
    if callable(getattr(obj, "call", None)):
        return "qwen-agent"
    if callable(getattr(obj, "execute", None)):
        return "agent-r1"
    return None


def registered_tool(name: str) -> type:
    """The class qwen-agent registered as `name` (its built-ins, and tools whose module was imported)."""
    try:
        import qwen_agent.tools  # noqa: F401 - registers the built-in tools
        from qwen_agent.tools.base import TOOL_REGISTRY
    except ImportError as exc:
        raise ManifestError(f"'{QWEN_AGENT_TARGET}:{name}' needs qwen-agent: .venv/bin/python -m pip install -e "
                            f"'.[qwen-agent]' ({exc})") from None
    if name not in TOOL_REGISTRY:
        raise ManifestError(f"no qwen-agent tool is registered as {name!r} (registered: {sorted(TOOL_REGISTRY)}); "
                            "for a tool class of your own, name the class: pkg.module:MyTool")
    return TOOL_REGISTRY[name]


def class_tool(spec: FunctionSpec, obj: Any) -> ClassTool | None:
    """The tool source of a tool class or instance; None when `obj` is a plain function."""
    kind = _interface(obj)
    return None if kind is None else ClassTool(spec, obj, kind)


def json_schema(parameters: Any, label: str) -> dict[str, Any]:
    """A tool's input schema from qwen-agent's `parameters`: a JSON schema as is, or its old list form
    `[{name, type, description, required}, ...]` as an object schema."""
    if parameters is None:
        return {"type": "object", "properties": {}}
    if isinstance(parameters, dict):
        return dict(parameters)
    if not isinstance(parameters, (list, tuple)):
        raise ManifestError(f"{label}: parameters must be a JSON schema or a list of parameter dicts, "
                            f"got {type(parameters).__name__}")
    properties, required = {}, []
    for i, param in enumerate(parameters):
        if not isinstance(param, dict) or not isinstance(param.get("name"), str):
            raise ManifestError(f"{label}: parameters[{i}] must be a dict with a 'name', got {param!r:.60}")
        properties[param["name"]] = {k: v for k, v in param.items() if k not in ("name", "required")}
        if param.get("required"):
            required.append(param["name"])
    return {"type": "object", "properties": properties, "required": required}


class ClassTool(FunctionTool):
    """One qwen-agent or Agent-R1 tool behind the function tools' interface (timeouts, threads, errors)."""

    def __init__(self, spec: FunctionSpec, obj: Any, kind: str):
        self.spec, self.kind = spec, kind
        self.label = f"{kind} tool '{spec.function}'"
        self.instance = self._build(obj)
        name = getattr(self.instance, "name", "")
        if not isinstance(name, str) or not name:
            raise ManifestError(f"{self.label}: the tool has no name (set the class's `name`)")
        schema = json_schema(getattr(self.instance, "parameters", None), self.label)
        method = self.instance.call if kind == "qwen-agent" else self.instance.execute
        self.fn = method
        self._is_async = inspect.iscoroutinefunction(method)
        self.tools = [Tool(name=name, description=str(getattr(self.instance, "description", "") or ""),
                           input_schema=schema)]
        self._semaphore = None

    def _build(self, obj: Any) -> Any:
        cfg = self.spec.cfg
        if not inspect.isclass(obj):
            if cfg is not None:
                raise ManifestError(f"{self.label}: cfg needs a class to build, and this is an instance")
            return obj
        try:
            if self.kind == "qwen-agent":
                return obj(cfg) if cfg is not None else obj()
            return obj(**cfg) if cfg is not None else obj()
        except Exception as exc:  # noqa: BLE001 - user code: the constructor's own error, named
            raise ManifestError(f"{self.label}: building the tool raised {type(exc).__name__}: {exc}") from None

    def _arguments(self, arguments: dict[str, Any]) -> dict[str, Any]:
        return arguments  # checked against the schema by the tool env already; the tool parses its own

    async def _invoke(self, arguments: dict[str, Any]) -> Any:
        if self.kind == "qwen-agent":
            kwargs = {"params": json.dumps(arguments, ensure_ascii=False)}
        else:
            kwargs = {"args": arguments, "tools_kwargs": {}}
        return await (self.fn(**kwargs) if self._is_async else _in_daemon_thread(self.fn, kwargs))

    def _result(self, value: Any) -> CallToolResult:
        if self.kind == "agent-r1" and isinstance(value, tuple):
            value = value[0]  # (response, reward, extra_info): the reward and extra_info are dropped
        return CallToolResult(content=[TextContent(type="text", text=_text(value))])


def _text(value: Any) -> str:
    """What the model sees of a tool's return value."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, (list, tuple)):
        return "\n".join(t for t in (_text(v) for v in value) if t)
    text = value.get("text") if isinstance(value, dict) else getattr(value, "text", None)
    if isinstance(text, str) and text:
        return text
    media = [k for k in ("image", "video", "audio", "file") if
             (value.get(k) if isinstance(value, dict) else getattr(value, k, None))]
    if media:
        return f"[{media[0]}]"
    return json.dumps(value, ensure_ascii=False, default=str)
