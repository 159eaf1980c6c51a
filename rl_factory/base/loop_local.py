"""`LoopLocal`: a value per running event loop, as `threading.local` is a value per thread.

asyncio primitives (a `Semaphore` binds to the loop that first waits on it) and httpx clients belong
to one event loop, while one scorer, executor or judge client may serve several `asyncio.run` calls
(validation, then training; a test after a test). Each of them used to keep its own `(loop, value)`
check. This module sits in the bottom layer (no imports from the rest of the project), next to
`rl_factory.base.types` and `rl_factory.base.registry`.
"""
from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class LoopLocal(Generic[T]):
    """`get()` returns `make()`'s value for the running event loop, made on first use in each loop."""

    def __init__(self, make: Callable[[], T]):
        self._make = make
        self._loop: Any = None
        self._value: T | None = None

    def get(self) -> T:
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            self._loop, self._value = loop, self._make()
        return self._value

    def pop(self) -> T | None:
        """Forget the value; return it if it was made in the running loop (so it can be closed there)."""
        value = self._value if self._loop is asyncio.get_running_loop() else None
        self._loop = self._value = None
        return value
