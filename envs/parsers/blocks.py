"""What the wire formats share: the `<tool_call>` block, the tool-name check, and malformed calls.

Both formats wrap each call in the Hermes tags, so the block pattern, the end-of-turn markers and
what makes a name acceptable live here once: a name the model wrote that is too long or holds
invalid Unicode (a lone surrogate repaired to U+FFFD) is a parse error under every parser, with
the same message, rather than a call to a tool that does not exist.
"""
from __future__ import annotations

import re

from rl_factory.base.types import ToolCall

TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>|<tool_call>(.*)", re.DOTALL)
# End-of-turn tokens an engine may leave in decoded text (stop-agnostic: strip if present).
END_MARKERS = ("<|im_end|>", "<|endoftext|>")
MAX_NAME_CHARS = 200
# Blocks read per text: a turn runs at most env.max_calls_per_turn calls (16 by default), and reading
# 14k blocks of a 1 MB text costs 0.2 s of the event loop; the rest become one malformed call.
MAX_BLOCKS = 1024
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


def call_blocks(text: str) -> tuple[list[tuple[str, str]], int]:
    """The first MAX_BLOCKS `<tool_call>` blocks of `text` as (body, raw) and how many more there are.

    The body of an unterminated last block has its end-of-turn markers stripped."""
    blocks, more = [], 0
    for match in TOOL_CALL.finditer(text):
        if len(blocks) == MAX_BLOCKS:
            more += 1
            continue
        closed = match.group(1) is not None
        blocks.append((match.group(1) if closed else strip_end_markers(match.group(2)), match.group(0)))
    return blocks, more


def unread_blocks(more: int) -> ToolCall:
    """The one call standing for the blocks past MAX_BLOCKS."""
    return malformed("", "", f"{more} more <tool_call> blocks were not read (at most {MAX_BLOCKS} per turn)")


def strip_end_markers(text: str) -> str:
    text = text.rstrip()
    for marker in END_MARKERS:
        text = text.removesuffix(marker).rstrip()
    return text
