"""Plain Python functions as tools, listed next to the MCP servers of a manifest.

    functions:
      - my_tools.py:word_count                    # a file: relative to the manifest, else the cwd
      - {function: my_pkg.tools:search, timeout_s: 5, cache: {ttl_s: 600}}

An entry may also name a tool class of qwen-agent's or Agent-R1's shape (envs.tool_classes), which runs
through the same call path below; envs/function_tools.py imports each entry and builds its tool.

The input schema comes from the type hints through the MCP SDK's own `func_metadata`, so a
function gets the same `input_schema` it would get served by an `MCPServer`; the Google-style
docstring adds the description (its text before `Args:`) and each parameter's description.
Arguments are validated by the tool env's JSON Schema check first, then by that pydantic model
(which also builds typed values such as pydantic models from JSON objects).

Async functions are awaited. A sync function runs on a daemon thread of its own: the event loop
never waits on it, and a hung one cannot block the process from exiting (executor threads are
joined at exit; Ctrl-C must not hang on a stuck tool). On timeout the call returns a "timeout"
error at once; a sync function's thread is abandoned (Python cannot kill a thread) and finishes
in the background. An exception becomes an error result `Error executing tool <name>: <message>`;
unlike a remote server's, the message is our own process's and is shown to the model. So does a
`SystemExit` (argparse, `exit()`) or any other BaseException the function raises
(`rl_factory.base.usercode`): only our own cancellation and Ctrl-C pass through.
"""
from __future__ import annotations

import asyncio
import contextvars
import inspect
import logging
import re
import threading
from collections.abc import Callable
from typing import Any

from mcp.server.mcpserver.utilities.func_metadata import FuncMetadata, func_metadata
from mcp.types import CallToolResult, TextContent, Tool
from pydantic import ValidationError

from envs.manifest import FunctionSpec, ManifestError
from envs.mcp_client import ToolCallError
from rl_factory.base.usercode import await_contained, contain

logger = logging.getLogger(__name__)

SECTION = re.compile(r"^(Args|Arguments|Parameters|Returns?|Yields?|Raises|Examples?|Notes?|"
                     r"Attributes|See Also|Warnings?):\s*$")
ARG_LINE = re.compile(r"^(\s*)\**(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")  # "  name (type): text"
ARG_SECTIONS = {"Args", "Arguments", "Parameters"}


class FunctionTool:
    """One Python function behind the same interface as an MCP server connection."""

    name = "functions"  # the `server` of its results, and its group in `python -m envs list`

    def __init__(self, spec: FunctionSpec, fn: Callable[..., Any]):
        self.spec = spec
        self.fn = fn
        self.label = f"function '{spec.function}'"
        try:
            self._meta: FuncMetadata = func_metadata(fn, structured_output=False)
        except Exception as exc:  # noqa: BLE001 - any signature pydantic cannot model
            raise ManifestError(f"{self.label}: cannot build a tool schema from its signature: "
                                f"{exc}") from None
        self._is_async = inspect.iscoroutinefunction(fn)
        self.tools = [build_tool(fn, self._meta)]
        self._semaphore: asyncio.Semaphore | None = None

    async def start(self) -> None:
        self._semaphore = asyncio.Semaphore(self.spec.max_concurrency)  # bound to the running loop

    async def stop(self) -> None:
        self._semaphore = None

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> CallToolResult:
        """Run the function; raises ToolCallError("timeout"), returns is_error results otherwise."""
        try:
            kwargs = self._arguments(arguments)
        except ValidationError as exc:
            return _error_result(name, str(exc))
        async with self._semaphore:
            # asyncio.wait rather than asyncio.timeout (3.11+): a TimeoutError the function itself
            # raises stays the function's error, only the deadline is a "timeout".
            task = asyncio.ensure_future(await_contained(self._invoke(kwargs)))
            try:
                done, _ = await asyncio.wait({task}, timeout=self.spec.timeout_s)
            except asyncio.CancelledError:
                task.cancel()
                raise
            if not done:
                task.cancel()
                raise ToolCallError("timeout", f"tool '{name}' timed out after {self.spec.timeout_s:g}s")
            try:
                value = task.result()
            except Exception as exc:  # noqa: BLE001 - the model sees it as a tool error
                logger.debug("function tool %r raised", name, exc_info=True)
                return _error_result(name, _describe(exc))
        try:
            return self._result(value)
        except Exception as exc:  # noqa: BLE001 - e.g. a return value that cannot be serialized
            return _error_result(name, f"cannot serialize the result: {_describe(exc)}")

    def _arguments(self, arguments: dict[str, Any]) -> dict[str, Any]:
        """The call's keyword arguments, typed by the signature's model (raises pydantic's ValidationError)."""
        return self._meta.validate_arguments(arguments)

    def _result(self, value: Any) -> CallToolResult:
        return self._meta.convert_result(value)

    async def _invoke(self, kwargs: dict[str, Any]) -> Any:
        # Called inside the task, so even a SystemExit the call itself raises is contained.
        return await (self.fn(**kwargs) if self._is_async else _in_daemon_thread(self.fn, kwargs))


def build_tool(fn: Callable[..., Any], meta: FuncMetadata) -> Tool:
    """The MCP `Tool` for `fn`: name, docstring summary, input schema with argument descriptions."""
    description, arg_docs = parse_docstring(inspect.getdoc(fn) or "")
    schema = meta.arg_model.model_json_schema(by_alias=True)
    for arg, text in arg_docs.items():
        prop = schema.get("properties", {}).get(arg)
        if prop is not None and text:
            prop.setdefault("description", text)
    return Tool(name=fn.__name__, description=description, input_schema=schema)


def parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """Google style: (text before the first section, {argument: description} from `Args:`)."""
    summary: list[str] = []
    args: dict[str, str] = {}
    section, arg, arg_indent = None, None, None
    for line in doc.splitlines():
        header = SECTION.match(line)
        if header:
            section, arg, arg_indent = header.group(1), None, None
            continue
        if section is None:
            summary.append(line)
            continue
        if section not in ARG_SECTIONS or not line.strip():
            continue
        match = ARG_LINE.match(line)
        indent = len(line) - len(line.lstrip())
        if match and (arg_indent is None or indent <= arg_indent):
            arg, arg_indent = match.group(2), indent
            args[arg] = match.group(3).strip()
        elif arg is not None:  # a continuation line of the current argument
            args[arg] = f"{args[arg]} {line.strip()}".strip()
    return "\n".join(summary).strip(), args


async def _in_daemon_thread(fn: Callable[..., Any], kwargs: dict[str, Any]) -> Any:
    loop = asyncio.get_running_loop()
    future = loop.create_future()
    context = contextvars.copy_context()

    def settle(value: Any, error: BaseException | None) -> None:
        if future.done():  # timed out or cancelled meanwhile: nobody is waiting
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(value)

    def work() -> None:
        try:
            value, error = context.run(fn, **kwargs), None
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting task
            value, error = None, contain(exc)  # a raw SystemExit would end the event loop
        try:
            loop.call_soon_threadsafe(settle, value, error)
        except RuntimeError:
            pass  # the loop closed while we ran: the run is over

    threading.Thread(target=work, name=f"tool-{fn.__name__}", daemon=True).start()
    return await future


def _error_result(name: str, message: str) -> CallToolResult:
    text = f"Error executing tool {name}: {message}"  # the wording MCPServer uses
    return CallToolResult(is_error=True, content=[TextContent(type="text", text=text)])


def _describe(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
