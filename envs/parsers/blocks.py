"""What the wire formats share: the `<tool_call>` block, the tool-name check, and malformed calls.

Both formats wrap each call in the Hermes tags, so the block pattern, the end-of-turn markers and
what makes a name acceptable live here once: a name the model wrote that is too long or holds
invalid Unicode (a lone surrogate repaired to U+FFFD) is a parse error under every parser, with
the same message, rather than a call to a tool that does not exist.
"""
from __future__ import annotations

import re

from rl_factory.types import ToolCall

TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>|<tool_call>(.*)", re.DOTALL)
# End-of-turn tokens an engine may leave in decoded text (stop-agnostic: strip if present).
END_MARKERS = ("<|im_end|>", "<|endoftext|>")
MAX_NAME_CHARS = 200
BAD_NAME = f"the tool name must be at most {MAX_NAME_CHARS} characters of valid Unicode"
# A name in a block that could not be read: JSON's "name" (hermes) or XML's <function=...> (qwen3_xml).
NAME_GUESS = re.compile(r'"name"\s*:\s*"([^"\\]{1,%d})"|<function=([^>\s]{1,%d})' % (MAX_NAME_CHARS, MAX_NAME_CHARS))


def name_problem(name: str) -> str | None:
    """Why `name` (non-empty) cannot be a tool name, or None."""
    return BAD_NAME if len(name) > MAX_NAME_CHARS or "\ufffd" in name else None


def malformed(name: str, raw: str, why: str) -> ToolCall:
    """A call that could not be read: no arguments, `error` says why (the model is told)."""
    return ToolCall(name=name, arguments=None, raw=raw, error=why)


def guess_name(body: str) -> str:
    """The tool a malformed block meant to call, for metrics and logs ('' if none is readable)."""
    match = NAME_GUESS.search(body)
    name = (match.group(1) or match.group(2)) if match else ""
    return "" if name_problem(name) else name


def strip_end_markers(text: str) -> str:
    text = text.rstrip()
    for marker in END_MARKERS:
        text = text.removesuffix(marker).rstrip()
    return text
