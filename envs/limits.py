"""What one tool call may cost: calls per turn and bytes of output (`env.max_calls_per_turn`,
`env.max_tool_output_bytes`), and how an over-long result is cut. Used by envs.tool_env (the caps)
and the transports (via `ToolLimits.wire_bytes`).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ToolLimits:
    """`env.max_calls_per_turn` and `env.max_tool_output_bytes` (see the module docstring)."""

    max_calls_per_turn: int = 16
    max_output_bytes: int = 64 * 1024

    def __post_init__(self) -> None:
        if self.max_calls_per_turn < 1:
            raise ValueError(f"env.max_calls_per_turn must be >= 1, got {self.max_calls_per_turn}")
        if self.max_output_bytes < 256:
            raise ValueError(f"env.max_tool_output_bytes must be >= 256, got {self.max_output_bytes}")

    @property
    def wire_bytes(self) -> int:
        """Largest message a transport reads whole: room for JSON escaping and structured copies."""
        return max(1 << 20, 16 * self.max_output_bytes)


def clip_bytes(text: str, max_bytes: int) -> str:
    """`text` cut to about `max_bytes` of UTF-8: its head and tail around a visible marker."""
    if len(text) <= max_bytes // 4:  # 4 bytes per character at most: no need to encode
        return text
    data = text.encode("utf-8")
    if len(data) <= max_bytes:
        return text
    head, tail = max_bytes // 2, max_bytes - max_bytes // 2
    dropped = len(data) - head - tail
    # errors="ignore" drops the partial characters the cuts may leave at the edges.
    return (data[:head].decode("utf-8", "ignore") + f"\n[... {dropped} bytes truncated ...]\n"
            + data[-tail:].decode("utf-8", "ignore"))
