"""Tool configurations written for RL-Factory, read as our manifest.

RL-Factory (`actor_rollout_ref.env.config_path`) reads a `.pydata` file: a Python literal holding a list
of entries, each an `{"mcpServers": {...}}` block, a qwen-agent tool's registered name, or a
`{"name": ..., **cfg}` mapping for one. We parse it with `ast.literal_eval`, which reads literals and
never runs code; the same list written as JSON (or YAML) works too. The entries become one manifest:

- every entry's `mcpServers` are merged, in order; a server name given twice keeps the later entry's
  (RL-Factory's tool map, too, keeps the later of two tools of one name). As in RL-Factory, where
  qwen-agent names a server's tools `<server>-<tool>`, each server gets `prefix: true` with
  `prefix_separator: "-"` (unless the entry sets `prefix`), so a model trained there calls the same names;
  and a `url` server without `type` is SSE, qwen-agent's default (ours is streamable HTTP);
  `sse_read_timeout` (qwen-agent's idle timeout of the stream) is dropped: `timeout_s` bounds each call;
- a name (`"code_interpreter"`) or `{"name": ..., ...}` entry becomes a `functions` entry
  `qwen-agent:<name>`, the tool qwen-agent registered under that name (the `qwen-agent` extra;
  envs.tool_classes), its mapping passed to the tool's constructor as `cfg`;
- an entry may also carry our own `functions` list, appended.

RL-Factory's WebUI tool spec (`envs/configs/calculator.json`: prompt templates and tools as inline
`pythonCode`) is refused with a message saying so: running code out of a config file is what a
manifest never does. Errors name the file and the entry (`tools.pydata: entry [1]: ...`).
"""
from __future__ import annotations

import ast
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from envs.manifest_error import ManifestError

logger = logging.getLogger("envs.manifest")

QWEN_AGENT_TARGET = "qwen-agent"  # `functions: ["qwen-agent:<registered name>"]`
DROPPED_SERVER_KEYS = ("sse_read_timeout",)
# (servers, functions, where) -> None, raising ManifestError: one entry validated as a manifest of its own
EntryCheck = Callable[[dict[str, Any], Any, str], None]


def read_pydata(path: Path, text: str) -> Any:
    """The literal in a `.pydata` file (parsed, never executed).

    Raises:
        ManifestError: the text is not a Python literal; the message gives the line.
    """
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError) as err:
        line = f" (line {err.lineno})" if getattr(err, "lineno", None) else ""
        raise ManifestError(f"{path}: not a Python literal{line}: {' '.join(str(err).split())[:200]}; a .pydata "
                            "manifest is read with ast.literal_eval, so it may hold only lists, dicts, strings, "
                            "numbers, booleans and None") from None


def is_webui_spec(data: Any) -> bool:
    """RL-Factory's WebUI tool spec (a mapping with prompts and tools as inline code), not a manifest."""
    return isinstance(data, dict) and "mcpServers" not in data and any(
        key in data for key in ("externalTools", "internalTools", "systemPrompt"))


def from_entries(entries: list[Any], source: str, check_entry: EntryCheck) -> dict[str, Any]:
    """One manifest mapping from RL-Factory's list of entries (see the module docstring); `check_entry` validates
    each entry's servers and functions on its own, so that an error names the entry.

    Raises:
        ManifestError: an entry that is none of the shapes above, or whose servers or functions are
            invalid; the message names the entry by its index.
    """
    servers: dict[str, Any] = {}
    functions: list[Any] = []
    origin: dict[str, int] = {}  # server name -> the entry that gave it
    for i, entry in enumerate(entries):
        where = f"{source}: entry [{i}]"
        if isinstance(entry, str) or (isinstance(entry, dict) and "name" in entry and "mcpServers" not in entry):
            functions.append(_registered_tool(entry, where))
            continue
        if not isinstance(entry, dict) or not ({"mcpServers", "functions"} & set(entry)):
            raise ManifestError(f"{where}: expected {{'mcpServers': {{...}}}}, a qwen-agent tool name or "
                                f"{{'name': ..., ...}}, got {entry!r:.80}")
        unknown = sorted(set(entry) - {"mcpServers", "functions"})
        if unknown:
            raise ManifestError(f"{where}: unknown key {unknown[0]!r} (an entry holds mcpServers and/or functions)")
        block = entry.get("mcpServers") or {}
        if not isinstance(block, dict):
            raise ManifestError(f"{where}: mcpServers must be a mapping of server names, got {type(block).__name__}")
        converted = {name: _server(spec, f"{where}: mcpServers.{name}") for name, spec in block.items()}
        check_entry(converted, entry.get("functions") or [], where)
        for name, spec in converted.items():
            if name in servers:
                logger.warning("%s: server %r replaces the one of entry [%d] (the later entry wins, as in RL-Factory)",
                               where, name, origin[name])
            servers[name], origin[name] = spec, i
        functions.extend(entry.get("functions") or [])
    manifest: dict[str, Any] = {"mcpServers": servers}
    if functions:
        manifest["functions"] = functions
    return manifest


def _server(spec: Any, where: str) -> Any:
    """A server of RL-Factory's (qwen-agent's) shape in ours: tools named `<server>-<tool>`, url servers SSE."""
    if not isinstance(spec, dict):
        return spec  # the manifest's own validation names it
    spec = {k: v for k, v in spec.items() if k not in DROPPED_SERVER_KEYS}
    if "prefix" not in spec:
        spec.update(prefix=True, prefix_separator="-")
    if "url" in spec and "type" not in spec and "transport" not in spec:
        spec["transport"] = "sse"
    return spec


def _registered_tool(entry: str | dict[str, Any], where: str) -> dict[str, Any]:
    name = entry if isinstance(entry, str) else entry.get("name")
    if not isinstance(name, str) or not name.isidentifier():
        raise ManifestError(f"{where}: a qwen-agent tool's registered name must be an identifier, got {name!r:.60}")
    spec: dict[str, Any] = {"function": f"{QWEN_AGENT_TARGET}:{name}"}
    if isinstance(entry, dict):
        spec["cfg"] = dict(entry)  # RL-Factory hands the whole mapping to the tool's constructor
    return spec
