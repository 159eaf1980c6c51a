"""What the Python sandbox keeps of a run's stdout and stderr: the first and last bytes, never all.

A run may print gigabytes; the model needs the start (what happened) and the end (where it failed).
`Capture` keeps `max_bytes` of each stream as head and tail around a `[... N bytes truncated ...]`
marker, and `drain` stops reading (and lets the caller kill the run) past MAX_DRAIN_BYTES.
"""
from __future__ import annotations

import asyncio
from collections.abc import Callable

MAX_DRAIN_BYTES = 16 << 20  # per stream; past this the run is killed rather than read forever
READ_CHUNK = 1 << 16


class Capture:
    """Keeps a stream's first and last bytes (max_bytes in all) and counts what it drops."""

    def __init__(self, max_bytes: int):
        self.head_max, self.tail_max = max_bytes // 2, max_bytes - max_bytes // 2
        self.head, self.tail, self.total = bytearray(), bytearray(), 0

    def add(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = self.head_max - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        self.tail += chunk
        if len(self.tail) > self.tail_max:
            del self.tail[:len(self.tail) - self.tail_max]

    @property
    def truncated(self) -> bool:
        return self.total > len(self.head) + len(self.tail)

    def text(self) -> str:
        head, tail = self.head.decode(errors="replace"), self.tail.decode(errors="replace")
        if not self.truncated:
            return head + tail
        dropped = self.total - len(self.head) - len(self.tail)
        return f"{head}\n[... {dropped} bytes truncated ...]\n{tail}"


async def drain(stream: asyncio.StreamReader, capture: Capture, on_flood: Callable[[], None]) -> None:
    """Read a run's stream into `capture`; past MAX_DRAIN_BYTES call `on_flood` (which kills the run)."""
    while chunk := await stream.read(READ_CHUNK):
        capture.add(chunk)
        if capture.total > MAX_DRAIN_BYTES:
            on_flood()
            return
