"""rl_factory.interrupt: a stop request cancels the run's main task so that every child's cleanup runs, and
the run ends with KeyboardInterrupt; inside `interruptible()` it stops the synchronous phase on the spot."""
import asyncio
import gc
import logging
import signal
import time

import pytest

from rl_factory import interrupt


def test_a_stop_cancels_the_main_task_and_every_child_cleans_up(caplog):
    cleaned: list[int] = []

    async def child(i: int) -> None:
        try:
            await asyncio.sleep(60)
        finally:
            cleaned.append(i)

    async def main() -> None:
        asyncio.get_running_loop().call_later(0.05, interrupt.request_stop)
        await asyncio.gather(*(child(i) for i in range(3)))

    start = time.monotonic()
    with caplog.at_level(logging.ERROR, logger="asyncio"), pytest.raises(KeyboardInterrupt):
        interrupt.run(main())
    gc.collect()  # a child left holding an exception would log "Task exception was never retrieved" here
    assert time.monotonic() - start < 10
    assert sorted(cleaned) == [0, 1, 2]
    assert not [r for r in caplog.records if "never retrieved" in r.getMessage()]


def test_a_run_that_was_not_asked_to_stop_returns_and_its_own_cancellation_is_not_an_interrupt():
    async def value() -> int:
        await asyncio.sleep(0)
        return 7

    async def cancelled() -> None:
        asyncio.current_task().cancel()
        await asyncio.sleep(1)

    assert interrupt.run(value()) == 7
    with pytest.raises(asyncio.CancelledError):
        interrupt.run(cancelled())


def test_a_stop_inside_a_synchronous_phase_raises_at_once():
    async def main() -> None:
        asyncio.get_running_loop().call_soon(lambda: None)
        with interrupt.interruptible():
            deadline = time.monotonic() + 60
            signal.setitimer(signal.ITIMER_REAL, 0.1)
            previous = signal.signal(signal.SIGALRM, lambda *_: interrupt.request_stop())
            try:
                while time.monotonic() < deadline:  # a phase that never awaits
                    pass
            finally:
                signal.signal(signal.SIGALRM, previous)

    start = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        interrupt.run(main())
    assert time.monotonic() - start < 10


def test_interruptible_keeps_an_ignored_sigint_ignored():
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with interrupt.interruptible():
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        with pytest.raises(KeyboardInterrupt):
            interrupt.request_stop()  # no run active: stop where the main thread is
    finally:
        signal.signal(signal.SIGINT, previous)
