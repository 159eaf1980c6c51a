"""Qwen3-Coder / Qwen3.5 tool calls: XML inside the Hermes tags, one value per parameter.

    <tool_call>
    <function=calculator>
    <parameter=expression>
    2 + 3
    </parameter>
    </function>
    </tool_call>

Like vLLM's `qwen3_coder` parser, the newline after `<parameter=k>` and before `</parameter>` is
not part of the value, a missing `</parameter>` ends at the next tag, and an unterminated last
block (the token budget ran out) is still parsed.

Values are text on the wire, so each is coerced to the type the tool's schema declares for that
parameter when it parses as JSON (`3` -> 3 for an integer, `[1, 2]` -> a list for an array). A
string parameter keeps the exact text; a parameter the parser has no schema for (no `tools`, an
unknown tool or parameter) stays a string for the argument check to judge; one whose schema
declares no type takes the JSON value.

Values are read as JSON with the bounds of `envs.parsers.safe_json` (a value past them stays text).
Unlike vLLM, a malformed block yields a call with `error` set (the model is told why) while the
well-formed calls of the same turn still run.
"""
from __future__ import annotations

import re
from typing import Any

from envs.parsers.registry import register_parser
from envs.parsers.blocks import (TOOL_CALL, call_blocks, guess_name, malformed, name_problem,
                                 strip_end_markers, unread_blocks)
from envs.parsers.safe_json import JSONProblem, load_json, repair_text
from rl_factory.base.types import ToolCall

# A name stops at the next "<": with `[^>\n]*` each of the 100k "<function=" of a 1 MB text without ">"
# scanned to the end of the text (quadratic: 56 s for 160 KB); this way each scan ends where the next
# tag begins, so the scans are disjoint and parsing is linear (benchmarks/parsers.py).
FUNCTION = re.compile(r"<function=([^<>\n]*)>(.*?)(?:</function>|$)", re.DOTALL)
PARAMETER = re.compile(r"<parameter=([^<>\n]*)>(.*?)(?:</parameter>|(?=<parameter=)|(?=</function>)|$)",
                       re.DOTALL)
# JSON Schema type of each JSON value Python parses (bool before int: bool is an int subclass).
JSON_TYPES = ((bool, "boolean"), (int, "integer"), (float, "number"), (str, "string"),
              (list, "array"), (dict, "object"), (type(None), "null"))


@register_parser("qwen3_xml")
class Qwen3XMLParser:
    """`parse(text) -> (content, calls)`; `tools` (OpenAI-shape schemas) types the values."""

    def __init__(self, tools: list[dict] | None = None):
        self._params: dict[str, dict[str, Any]] = {}
        for tool in tools or []:
            fn = tool.get("function", tool)
            self._params[fn.get("name", "")] = (fn.get("parameters") or {}).get("properties") or {}

    def parse(self, text: str) -> tuple[str, list[ToolCall]]:
        text = repair_text(text)
        blocks, more = call_blocks(text)
        calls = [call for body, raw in blocks for call in self._block(body, raw=raw)]
        if more:
            calls.append(unread_blocks(more))
        content = strip_end_markers(TOOL_CALL.sub("", text)).strip()
        return content, calls

    def _block(self, body: str, raw: str) -> list[ToolCall]:
        if not body.strip():
            return [malformed("", raw, "empty <tool_call> block")]
        functions = list(FUNCTION.finditer(body))
        if not functions:
            return [malformed(guess_name(body), raw, "expected <function=NAME> ... </function> "
                                                      "inside <tool_call>")]
        return [self._call(m.group(1).strip(), m.group(2), raw) for m in functions]

    def _call(self, name: str, inner: str, raw: str) -> ToolCall:
        if not name:
            return malformed("", raw, "empty function name in <function=...>")
        if problem := name_problem(name):
            return malformed("", raw, problem)
        schemas = self._params.get(name, {})
        arguments: dict[str, Any] = {}
        for match in PARAMETER.finditer(inner):
            key = match.group(1).strip()
            if not key:
                return malformed(name, raw, "empty parameter name in <parameter=...>")
            if key in arguments:
                return malformed(name, raw, f"parameter '{key}' is given twice")
            value = match.group(2).removeprefix("\n").removesuffix("\n")
            arguments[key] = coerce(value, schemas.get(key))
        return ToolCall(name=name, arguments=arguments, raw=raw)


def coerce(value: str, schema: dict[str, Any] | None) -> Any:
    """The parameter's text as the type its schema wants, when it parses as JSON of that type."""
    types = _schema_types(schema) if schema is not None else {"string"}
    if types == {"string"}:
        return value
    if "boolean" in types and value.strip() in ("True", "False"):  # Python spelling, a common slip
        return value.strip() == "True"
    try:
        parsed = load_json(value)
    except JSONProblem:
        return value  # the argument check will say what was expected
    kind = next(t for cls, t in JSON_TYPES if isinstance(parsed, cls))
    if not types or kind in types or (kind == "integer" and "number" in types):
        return parsed
    return value if "string" in types else parsed


def _schema_types(schema: dict[str, Any]) -> set[str]:
    """JSON types a schema allows (from `type`, `anyOf`/`oneOf`, `enum`); empty = any."""
    declared = schema.get("type")
    types = set([declared] if isinstance(declared, str) else declared or [])
    for option in schema.get("anyOf", []) + schema.get("oneOf", []):
        if isinstance(option, dict):
            types |= _schema_types(option) or {"any"}
    for item in schema.get("enum", []):
        types.add(next(t for cls, t in JSON_TYPES if isinstance(item, cls)))
    return set() if "any" in types else types
