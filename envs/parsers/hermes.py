"""Hermes-style tool calls, as Qwen2.5 and Qwen3 write them.

    <tool_call>
    {"name": "calculator", "arguments": {"expression": "2+3"}}
    </tool_call>

Departs from vLLM's `hermes` parser, where one bad block turns the whole output into plain
content, and from verl's, which drops bad blocks silently: here every block yields a ToolCall,
and a malformed one carries `error` (and a best-guess name) so the model sees why it failed
while the good blocks of the same turn still run. Like vLLM, an unterminated last block (the
generation stopped before `</tool_call>`) is parsed too. `arguments` may be an object or a JSON
string holding one; a missing `arguments` means no arguments. JSON is read with bounds
(`envs.parsers.safe_json`: size, nesting depth, number length, lone surrogates repaired), so no
text a model writes makes `parse` raise.

Not for Qwen3-Coder / Qwen3.5, which use an XML `<function=...>` format inside the tags.
"""
from __future__ import annotations

from envs.parsers.registry import register_parser
from envs.parsers.blocks import (TOOL_CALL, call_blocks, guess_name, malformed, name_problem,
                                 strip_end_markers, unread_blocks)
from envs.parsers.safe_json import JSONProblem, load_json, repair_text
from rl_factory.base.types import ToolCall


@register_parser("hermes")
class HermesParser:
    """`parse(text) -> (content, calls)`; content is the text with every call block removed."""

    def __init__(self, tools: list[dict] | None = None):
        pass  # JSON arguments carry their own types

    def parse(self, text: str) -> tuple[str, list[ToolCall]]:
        text = repair_text(text)  # an engine that hands us text (not ids) may pass lone surrogates
        blocks, more = call_blocks(text)
        calls = [_to_call(body, raw=raw) for body, raw in blocks] + ([unread_blocks(more)] if more else [])
        content = strip_end_markers(TOOL_CALL.sub("", text)).strip()
        return content, calls


def _to_call(body: str, raw: str) -> ToolCall:
    body = body.strip()
    if not body:
        return malformed("", raw, "empty <tool_call> block")
    try:
        obj = load_json(body)
    except JSONProblem as err:
        return malformed(guess_name(body), raw, str(err))
    if not isinstance(obj, dict):
        return malformed("", raw, 'expected a JSON object {"name": ..., "arguments": {...}}')
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return malformed("", raw, 'missing "name" (a non-empty string)')
    if problem := name_problem(name):
        return malformed("", raw, problem)
    arguments = obj.get("arguments")
    if isinstance(arguments, str):
        try:
            arguments = load_json(arguments) if arguments.strip() else {}
        except JSONProblem as err:
            return malformed(name, raw, f'"arguments" is a string but not valid JSON: {err}')
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        return malformed(name, raw, f'"arguments" must be a JSON object, got {type(arguments).__name__}')
    return ToolCall(name=name, arguments=arguments, raw=raw)
