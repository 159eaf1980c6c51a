"""Where a sync reward function runs (`reward.executor`): the event loop, a thread, or a process.

- `inline` (default): called on the event loop. Right for cheap rules; a slow one stalls the
  rollouts still in flight, and its timeout can only be checked after it returns.
- `thread`: `asyncio.to_thread`, for rewards that wait (a subprocess, a sandbox, an HTTP call).
  A timed-out call is abandoned, not stopped: Python cannot kill a thread.
- `process`: a pool of spawned worker processes, for CPU-heavy rewards (they would hold the GIL
  in a thread). A timed-out call's worker is killed and the pool restarted; calls that were
  running beside it on the killed pool are retried once. Arguments and results must pickle, so
  a function that names `tools` (a live connection) cannot run here.

Async functions always run on the event loop (they are waiting, not computing); `timeout_s`
applies to them too. A timeout raises `RewardTimeout`, which the reward counts as an error.
"""
from __future__ import annotations

import asyncio
import inspect
import multiprocessing
import multiprocessing.connection
import os
import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from rewards.loader import RewardFn, RewardLoadError, load_reward
from rl_factory.registry import Registry


class RewardTimeout(TimeoutError):
    """A reward call ran longer than `reward.timeout_s`."""


class Executor:
    """Runs one reward call; subclasses decide where sync functions run."""

    def __init__(self, max_workers: int = 4):
        self.max_workers = max_workers

    def check(self, fn: RewardFn) -> None:
        """Refuse, at build time, a function this executor cannot run."""

    async def run(self, fn: RewardFn, kwargs: dict[str, Any], timeout_s: float | None) -> Any:
        """The function's raw result for `kwargs` (already selected for it)."""
        if fn.is_async:
            return await _awaited(fn.fn(**kwargs), timeout_s)
        return await self.run_sync(fn, kwargs, timeout_s)

    async def run_sync(self, fn: RewardFn, kwargs: dict[str, Any], timeout_s: float | None) -> Any:
        raise NotImplementedError

    def close(self) -> None:
        pass


EXECUTORS: Registry[type[Executor]] = Registry("reward executor")
register_executor = EXECUTORS.register  # class decorator; a taken name is an error


def get_executor(name: str, **options: Any) -> Executor:
    if name not in EXECUTORS:
        raise RewardLoadError(f"reward.executor: unknown executor {name!r} (valid: {', '.join(EXECUTORS)})")
    return EXECUTORS[name](**options)


@register_executor("inline")
class InlineExecutor(Executor):
    async def run_sync(self, fn: RewardFn, kwargs: dict[str, Any], timeout_s: float | None) -> Any:
        start = time.perf_counter()
        result = fn.fn(**kwargs)
        if inspect.isawaitable(result):  # a sync wrapper that returns a coroutine
            result = await _awaited(result, timeout_s)
        elapsed = time.perf_counter() - start
        if timeout_s is not None and elapsed > timeout_s:
            raise RewardTimeout(f"took {elapsed:.1f}s, over reward.timeout_s={timeout_s:g} "
                                "(reward.executor=thread or process can stop waiting for it)")
        return result


@register_executor("thread")
class ThreadExecutor(Executor):
    async def run_sync(self, fn: RewardFn, kwargs: dict[str, Any], timeout_s: float | None) -> Any:
        return await _awaited(asyncio.to_thread(fn.fn, **kwargs), timeout_s)


@register_executor("process")
class ProcessExecutor(Executor):
    def __init__(self, max_workers: int = 4):
        super().__init__(min(max_workers, os.cpu_count() or 1))
        self._pool: ProcessPoolExecutor | None = None
        self._generation = 0  # bumped when the pool is replaced
        self._killed: set[int] = set()  # generations this executor killed on a timeout

    def check(self, fn: RewardFn) -> None:
        if not fn.is_async and "tools" in fn.arg_names:
            raise RewardLoadError(f"reward function {fn.name} names `tools`, a live connection that cannot "
                                  "reach a worker process; make it async, or use reward.executor=thread")

    async def run_sync(self, fn: RewardFn, kwargs: dict[str, Any], timeout_s: float | None) -> Any:
        # A file-spec function is loaded again by spec in the worker (its module is not importable
        # by name there); others travel pickled, by reference.
        target = fn.spec or fn.fn
        kwargs = {k: v for k, v in kwargs.items() if k != "tools"}  # only there through **kwargs
        for _ in range(2):
            pool, generation = self._current()
            future = asyncio.wrap_future(pool.submit(_call_in_worker, target, kwargs))
            try:
                return await _awaited(future, timeout_s)
            except RewardTimeout:
                self._kill(generation)
                raise
            except BrokenProcessPool:
                if generation not in self._killed:  # it died of this call or a neighbour's crash
                    self._replace(generation)
                    raise WorkerError("the reward's worker process died (a crash, os._exit or out of memory)")
        raise WorkerError("the reward's worker pool was restarted twice during this call")

    def _current(self) -> tuple[ProcessPoolExecutor, int]:
        if self._pool is None:
            # spawn, not fork: forking a process that holds torch threads and an event loop can deadlock.
            self._pool = ProcessPoolExecutor(self.max_workers, mp_context=multiprocessing.get_context("spawn"),
                                             initializer=_init_worker)
        return self._pool, self._generation

    def _kill(self, generation: int) -> None:
        if generation != self._generation or self._pool is None:
            return  # already replaced by another call's timeout
        self._killed.add(generation)
        # The pool cannot cancel a running call; killing its workers is the only way to stop it.
        for process in list(getattr(self._pool, "_processes", {}).values()):
            process.kill()
        self._replace(generation)

    def _replace(self, generation: int) -> None:
        if generation == self._generation and self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool, self._generation = None, self._generation + 1

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None


class WorkerError(RuntimeError):
    """A worker process failed underneath a reward call (not the reward's own exception)."""


_LOADED: dict[str, Callable[..., Any]] = {}  # per worker process: spec -> function


def _init_worker() -> None:
    # Ctrl-C reaches the whole process group: the trainer handles it; workers would print tracebacks.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    parent = multiprocessing.parent_process()
    if parent is not None:  # a SIGKILLed trainer runs no cleanup: leave with it rather than linger
        threading.Thread(target=_exit_with, args=(parent.sentinel,), daemon=True).start()


def _exit_with(sentinel: int) -> None:
    multiprocessing.connection.wait([sentinel])
    os._exit(1)


def _call_in_worker(target: str | Callable[..., Any], kwargs: dict[str, Any]) -> Any:
    if isinstance(target, str):
        if target not in _LOADED:
            _LOADED[target] = load_reward(target).fn
        target = _LOADED[target]
    return target(**kwargs)


async def _awaited(awaitable: Any, timeout_s: float | None) -> Any:
    if timeout_s is None:
        return await awaitable
    # Not wait_for: a TimeoutError the reward raises itself must not read as our timeout.
    task = asyncio.ensure_future(awaitable)
    try:
        done, _ = await asyncio.wait({task}, timeout=timeout_s)
    finally:
        if not task.done():
            task.cancel()
    if not done:
        raise RewardTimeout(f"timed out after reward.timeout_s={timeout_s:g}s")
    return task.result()
