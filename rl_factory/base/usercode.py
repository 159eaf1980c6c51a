"""User code (tools, rewards, judges) must not take the run down: its `SystemExit` is an error.

`argparse` calls `sys.exit(2)` on a bad argument and `exit()` ends scripts; inside a function tool or
a reward either would end the trainer, and asyncio makes it worse: a task whose coroutine raises
`SystemExit` or `KeyboardInterrupt` re-raises it out of the event loop, past every `except
Exception` of its awaiters. So every call into user code goes through one of these helpers, which
turn any `BaseException` into `UserCodeExit` (an ordinary `Exception`) at the point where it is
raised, before asyncio sees it. Two are let through: `asyncio.CancelledError` (our own
cancellation) and a `KeyboardInterrupt` in the main thread (Ctrl-C). A `KeyboardInterrupt` raised
in a worker thread is user code's, since signals only reach the main thread.

This module sits in the bottom layer (no imports from the rest of the project), next to
`rl_factory.base.types` and `rl_factory.base.registry`.
"""
from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

T = TypeVar("T")


class UserCodeExit(RuntimeError):
    """User code raised a BaseException that is not an error type (`SystemExit`, `GeneratorExit`, ...)."""


def passes_through(exc: BaseException) -> bool:
    """Whether `exc` must propagate: our cancellation, or Ctrl-C in the main thread."""
    if isinstance(exc, asyncio.CancelledError):
        return True
    return isinstance(exc, KeyboardInterrupt) and threading.current_thread() is threading.main_thread()


def contain(exc: BaseException) -> BaseException:
    """`exc` itself when it is an `Exception` or must pass through, else a `UserCodeExit` for it."""
    if isinstance(exc, Exception) or passes_through(exc):
        return exc
    detail = f" {exc}" if str(exc) else ""
    contained = UserCodeExit(f"{type(exc).__name__}{detail} (user code tried to exit; "
                             "treated as an error, the run goes on)")
    contained.__cause__ = exc
    return contained


def call_contained(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """`fn(*args, **kwargs)`, with a non-error BaseException re-raised as `UserCodeExit`."""
    try:
        return fn(*args, **kwargs)
    except BaseException as exc:  # noqa: BLE001 - the point of this module
        contained = contain(exc)
        if contained is exc:
            raise
        raise contained from exc


async def await_contained(awaitable: Awaitable[T]) -> T:
    """Await user code; run this coroutine as the task, so asyncio never sees a raw SystemExit."""
    try:
        return await awaitable
    except BaseException as exc:  # noqa: BLE001
        contained = contain(exc)
        if contained is exc:
            raise
        raise contained from exc
