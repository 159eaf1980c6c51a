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

from envs.parsers import hermes, qwen3_xml  # noqa: F401  (they register themselves in PARSERS)
from envs.parsers.registry import PARSERS, ToolCallParser, get_parser, register_parser

__all__ = ["PARSERS", "ToolCallParser", "get_parser", "register_parser"]
