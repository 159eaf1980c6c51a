"""Tool-call parsers: decoded model text -> (content, tool calls), one small class per wire format.

A parser works on decoded text only, so it does not care whether the engine stopped on a stop
string, an eos token, or the token budget (an unterminated last call is still parsed). It never
raises on model output: a block it cannot read becomes a `ToolCall` with `error` set, so the model
is told what was wrong. Register a new format with `@register_parser("name")`.

Parsers are built with the env's tool schemas (`get_parser(name, tools=env.tools)`): a wire
format whose values are untyped text (qwen3_xml) needs them to coerce values; others ignore them.

    hermes      <tool_call>{"name": ..., "arguments": {...}}</tool_call>   Qwen2.5, Qwen3
    qwen3_xml   <tool_call><function=f><parameter=k>v</parameter></function></tool_call>
                                                                   Qwen3-Coder, Qwen3.5
"""
from __future__ import annotations

from typing import Any, Protocol

from rl_factory.registry import Registry
from rl_factory.types import ToolCall


class ToolCallParser(Protocol):
    def parse(self, text: str) -> tuple[str, list[ToolCall]]:
        """Split `text` into (content without the call blocks, calls in order)."""
        ...


PARSERS: Registry[type] = Registry("tool-call parser")
register_parser = PARSERS.register  # class decorator; a second parser of the same name is an error


def get_parser(name: str, tools: list[dict[str, Any]] | None = None) -> ToolCallParser:
    """A new instance of the parser registered as `name`; KeyError lists the valid names.

    Args:
        name: registry key, e.g. "hermes" or "qwen3_xml".
        tools: the OpenAI-shape tool schemas the model was shown (`env.tools`), if any.
    """
    return PARSERS.lookup(name)(tools=tools)


# Imported last: these modules register themselves with the decorator above.
from envs.parsers import hermes, qwen3_xml  # noqa: E402,F401

__all__ = ["PARSERS", "ToolCallParser", "get_parser", "register_parser"]
