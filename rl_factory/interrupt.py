"""Ctrl-C and SIGTERM during a long synchronous phase that runs on the event loop's thread.

`asyncio.run` answers the first SIGINT (and SIGTERM, which rl_factory.cli turns into one) by cancelling
the main task, which takes effect at its next `await`. A phase that never awaits (building the builtin
model: minutes; the policy update: 20 s of a CPU step) would run to its end first: a run told to stop went
on building its model for 40 minutes. Inside `interruptible()` Python's own handler is back, which raises
KeyboardInterrupt between two bytecodes of the phase; it unwinds through the run's cleanup as Ctrl-C does.

Only for phases whose work is thrown away when they stop (a build into a temporary directory, an update
of weights no checkpoint holds yet), never around a write that must finish (a checkpoint).
"""
from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator


@contextlib.contextmanager
def interruptible() -> Iterator[None]:
    """Ctrl-C / SIGTERM raise KeyboardInterrupt at once inside the block (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
