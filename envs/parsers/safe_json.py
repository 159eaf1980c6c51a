"""JSON from model output, with bounds: no input a model writes makes a parser raise or stall.

`json.loads` alone is not safe on adversarial text: deep nesting raises `RecursionError` (or passes
its ~1000 levels and breaks the schema check and serializers later), an integer of 5,000 digits
raises `ValueError` (Python's int-string limit) and a float of 400 digits becomes `inf`, and a
`"\\ud800"` escape yields a lone UTF-16 surrogate that no UTF-8 writer accepts. `load_json` checks
size and nesting depth in one linear scan first, refuses long numbers and NaN/Infinity, and repairs
lone surrogates to U+FFFD in every string; any problem comes back as a message for the model.
"""
from __future__ import annotations

import json
import re
from typing import Any

MAX_JSON_CHARS = 512 * 1024  # one tool call's JSON; run_python code fits (its own cap is 200k chars)
MAX_DEPTH = 64  # nesting of objects and arrays; real tool arguments use a handful
MAX_NUMBER_CHARS = 64  # a number literal's characters (sign, digits, point, exponent)

_STRUCTURE = re.compile(r'[\[\]{}"\\]')
SURROGATE = re.compile("[\ud800-\udfff]")


class JSONProblem(ValueError):
    """Model-written JSON that is invalid or past a bound; the message is for the model."""


def load_json(text: str) -> Any:
    """Parse `text` as JSON within the bounds above; raises `JSONProblem` saying what is wrong."""
    if len(text) > MAX_JSON_CHARS:
        raise JSONProblem(f"JSON of {len(text)} characters is longer than {MAX_JSON_CHARS}")
    depth = max_depth(text)
    if depth > MAX_DEPTH:
        raise JSONProblem(f"JSON nested {depth} levels deep; at most {MAX_DEPTH} are allowed")
    try:
        value = json.loads(text, parse_int=_number(int), parse_float=_number(float),
                           parse_constant=_no_constant)
    except JSONProblem:
        raise
    except json.JSONDecodeError as err:
        raise JSONProblem(f"invalid JSON ({err.msg} at line {err.lineno} column {err.colno})") from None
    except (ValueError, RecursionError) as err:  # belt and braces: the scan above should prevent both
        raise JSONProblem(f"invalid JSON ({type(err).__name__})") from None
    return repair_strings(value)


def max_depth(text: str) -> int:
    """Deepest nesting of [] and {} outside strings; linear, visits only the structural characters."""
    depth = deepest = 0
    in_string, skip_at = False, -1
    for match in _STRUCTURE.finditer(text):
        pos, char = match.start(), match.group()
        if pos == skip_at:  # the character after a backslash inside a string
            continue
        if in_string:
            if char == "\\":
                skip_at = pos + 1
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth = max(0, depth - 1)
    return deepest


def repair_strings(value: Any) -> Any:
    """`value` with lone surrogates in its strings (keys too) replaced by U+FFFD; iterative."""
    if isinstance(value, str):
        return repair_text(value)
    if not isinstance(value, (dict, list)):
        return value
    root = [value]
    stack: list[tuple[Any, Any, Any]] = [(root, 0, value)]
    while stack:
        parent, key, node = stack.pop()
        if isinstance(node, dict):
            fixed = {}
            for k, v in node.items():
                fixed[repair_text(k)] = v
            parent[key] = fixed
            for k, v in fixed.items():
                if isinstance(v, (dict, list, str)):
                    stack.append((fixed, k, v))
        elif isinstance(node, list):
            for i, v in enumerate(node):
                if isinstance(v, (dict, list, str)):
                    stack.append((node, i, v))
        else:
            parent[key] = repair_text(node)
    return root[0]


def repair_text(text: str) -> str:
    """`text` with every lone UTF-16 surrogate replaced by U+FFFD (what a UTF-8 decoder would show)."""
    return SURROGATE.sub("\ufffd", text) if SURROGATE.search(text) else text


def _number(kind: type):
    def parse(literal: str) -> Any:
        if len(literal) > MAX_NUMBER_CHARS:
            raise JSONProblem(f"a number of {len(literal)} characters; at most {MAX_NUMBER_CHARS} are allowed")
        return kind(literal)
    return parse


def _no_constant(name: str) -> Any:
    raise JSONProblem(f"{name} is not valid JSON")
