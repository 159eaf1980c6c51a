"""Ctrl-C and SIGTERM: stop the run at once, with its cleanup, whatever phase it is in.

`run(coro)` is `asyncio.run` for the entry points (training, evaluation, rescoring, the doctor). A stop
request (`request_stop()`, which rl_factory.cli calls on SIGTERM) cancels its main task, which takes effect
at the task's next `await` and unwinds through every `finally` (per-episode servers, the checkpoint writer,
the rollout file); `run` then raises KeyboardInterrupt, as `asyncio.run` does for Ctrl-C. This works also
when the job started with SIGINT ignored (a background job of a script: `cmd &`), where `asyncio.run`
installs no SIGINT handler; raising KeyboardInterrupt from the signal handler instead would land inside
whichever child task runs, which is then never awaited again (its traceback logged as "never retrieved").

A phase that never awaits (building the builtin model: minutes; the policy update: 20 s of a CPU step)
would run to its end before a cancellation takes effect: a run told to stop went on building its model for
40 minutes. Inside `interruptible()` a stop raises KeyboardInterrupt between two bytecodes of the phase
instead (Ctrl-C too: Python's own SIGINT handler is back there, unless the job ignores SIGINT).

`interruptible()` is only for phases whose work is thrown away when they stop (a build into a temporary
directory, an update of weights no checkpoint holds yet), never around a write that must finish.
"""
from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
from collections.abc import Coroutine, Iterator
from typing import Any, TypeVar

T = TypeVar("T")

_main: list[tuple[asyncio.AbstractEventLoop, asyncio.Task]] = []  # the running `run`s, innermost last
_requested: list[bool] = []  # stop requests since the last `run` started
_synchronous: list[bool] = []  # inside `interruptible()` on the main thread


def run(coro: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run(coro)` whose main task `request_stop()` cancels; raises KeyboardInterrupt then."""

    async def root() -> T:
        _main.append((asyncio.get_running_loop(), asyncio.current_task()))
        try:
            return await coro
        finally:
            _main.pop()

    _requested.clear()
    try:
        return asyncio.run(root())
    except asyncio.CancelledError:
        if _requested:
            raise KeyboardInterrupt from None
        raise


def request_stop() -> None:
    """Stop the running `run` (called from a signal handler, on the main thread). Raises KeyboardInterrupt
    right here when no `run` is active, inside `interruptible()`, or on a second request."""
    _requested.append(True)
    if not _main or _synchronous or len(_requested) > 1:
        raise KeyboardInterrupt
    loop, task = _main[-1]
    task.cancel()
    loop.call_soon_threadsafe(lambda: None)  # wake a loop asleep in select() so the cancellation runs


@contextlib.contextmanager
def interruptible() -> Iterator[None]:
    """Ctrl-C / SIGTERM raise KeyboardInterrupt at once inside the block (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGINT)
    if previous is not signal.SIG_IGN:  # a job that ignores Ctrl-C goes on ignoring it
        signal.signal(signal.SIGINT, signal.default_int_handler)
    _synchronous.append(True)
    try:
        yield
    finally:
        _synchronous.pop()
        if previous is not signal.SIG_IGN:
            signal.signal(signal.SIGINT, previous)
