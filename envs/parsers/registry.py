"""The tool-call parser registry: `register_parser` adds a wire format, `get_parser` builds one by name.

Apart from the package's `__init__` so that the parser modules, which register themselves here, and
the package, which imports them to fill the registry, do not import each other.
"""
from __future__ import annotations

from typing import Any, Protocol

from rl_factory.base.registry import Registry
from rl_factory.base.types import ToolCall


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
