"""TTL result cache for deterministic tools (a server's or function's `cache:` knob).

Keyed by tool name plus the arguments as canonical JSON (sorted keys, no whitespace), so
`{"a": 1, "b": 2}` and `{"b": 2, "a": 1}` are one entry. Only successful results are stored:
an error (a timeout, a crashed server) is retried by the next identical call.

Identical calls that arrive while the first is still running wait for it rather than calling
the tool again (GRPO's n rollouts of one prompt often make the same call at the same moment);
they count as hits. If that first call fails or is cancelled, each waiter runs its own.
"""
from __future__ import annotations

import asyncio
import json
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any

from envs.knobs import CacheSpec
from rl_factory.base.types import ToolResult


class ResultCache:
    """LRU with per-entry expiry; `run(key, compute)` is the only way results get in."""

    def __init__(self, spec: CacheSpec, clock: Callable[[], float] = time.monotonic):
        self.spec = spec
        self._clock = clock
        self._entries: OrderedDict[str, tuple[float, str]] = OrderedDict()  # key -> (expires_at, text)
        self._inflight: dict[str, asyncio.Future] = {}

    def applies_to(self, tool: str) -> bool:
        return self.spec.tools is None or tool in self.spec.tools

    @staticmethod
    def key(tool: str, arguments: dict[str, Any]) -> str:
        return tool + "\0" + json.dumps(arguments, sort_keys=True, separators=(",", ":"),
                                        ensure_ascii=False, default=str)

    def get(self, key: str) -> str | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        if entry[0] <= self._clock():
            del self._entries[key]
            return None
        self._entries.move_to_end(key)
        return entry[1]

    def _put(self, key: str, text: str) -> None:
        self._entries[key] = (self._clock() + self.spec.ttl_s, text)
        self._entries.move_to_end(key)
        while len(self._entries) > self.spec.max_entries:
            self._entries.popitem(last=False)

    async def run(self, key: str, compute: Callable[[], Awaitable[ToolResult]]) -> ToolResult | str:
        """The cached text on a hit, else the ToolResult of `compute()` (cached if it succeeded)."""
        while True:
            text = self.get(key)
            if text is not None:
                return text
            leader = self._inflight.get(key)
            if leader is None:
                break
            # shield: a waiter that is cancelled must not cancel the shared future.
            text = await asyncio.shield(leader)
            if text is not None:
                return text
        done = asyncio.get_running_loop().create_future()
        self._inflight[key] = done
        text = None
        try:
            result = await compute()
            if result.ok:
                self._put(key, result.text)
                text = result.text
            return result
        finally:
            del self._inflight[key]
            done.set_result(text)  # None tells the waiters to run the call themselves

    def __len__(self) -> int:
        return len(self._entries)
