"""Where a sync reward function runs (`reward.executor`): the event loop, a thread, or a process.

- `inline` (default): called on the event loop. Right for cheap rules; a slow one stalls the
  rollouts still in flight, and its timeout can only be checked after it returns.
- `thread`: `asyncio.to_thread`, for rewards that wait (a subprocess, a sandbox, an HTTP call).
  A timed-out call is abandoned, not stopped: Python cannot kill a thread.
- `process`: spawned worker processes, for CPU-heavy rewards (they would hold the GIL in a
  thread). Each worker runs one call at a time in its own process group, so a failure is always
  its own call's: a worker that dies (a segfault, `os._exit`, the OOM killer) fails only the call
  it was running (`WorkerError`), and a call past its timeout has its worker's whole process group
  killed (the reward's own subprocesses too); the neighbours never notice, and the next call gets
  a fresh worker. Arguments and results must pickle, so a function that names `tools` (a live
  connection) cannot run here.

Async functions always run on the event loop (they are waiting, not computing); `timeout_s`
applies to them too. A timeout raises `RewardTimeout`, which the scorer counts as an error. On
every executor a `SystemExit` (or other BaseException) from the reward becomes an ordinary error
(`rl_factory.base.usercode`): a reward cannot end the run.
"""
from __future__ import annotations

import asyncio
import inspect
import multiprocessing
import multiprocessing.connection
import os
import pickle
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

from rewards.loader import RewardFn, RewardLoadError, load_reward
from rl_factory.base.usercode import await_contained, call_contained
from rl_factory.base.loop_local import LoopLocal
from rl_factory.base.registry import Registry


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
            return await _awaited(await_contained(_call_async(fn.fn, kwargs)), timeout_s)
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
        result = call_contained(fn.fn, **kwargs)
        if inspect.isawaitable(result):  # a sync wrapper that returns a coroutine
            result = await _awaited(await_contained(result), timeout_s)
        elapsed = time.perf_counter() - start
        if timeout_s is not None and elapsed > timeout_s:
            raise RewardTimeout(f"took {elapsed:.1f}s, over reward.timeout_s={timeout_s:g} "
                                "(reward.executor=thread or process can stop waiting for it)")
        return result


@register_executor("thread")
class ThreadExecutor(Executor):
    async def run_sync(self, fn: RewardFn, kwargs: dict[str, Any], timeout_s: float | None) -> Any:
        return await _awaited(asyncio.to_thread(call_contained, fn.fn, **kwargs), timeout_s)


@register_executor("process")
class ProcessExecutor(Executor):
    """Spawned worker processes, one call at a time each (see the module docstring)."""

    def __init__(self, max_workers: int = 4):
        super().__init__(max(1, min(max_workers, os.cpu_count() or 1)))
        self._idle: list[_Worker] = []
        self._workers: set[_Worker] = set()
        self._slots = LoopLocal(lambda: asyncio.Semaphore(self.max_workers))

    def check(self, fn: RewardFn) -> None:
        if not fn.is_async and "tools" in fn.arg_names:
            raise RewardLoadError(f"reward function {fn.name} names `tools`, a live connection that cannot "
                                  "reach a worker process; make it async, or use reward.executor=thread")

    async def run_sync(self, fn: RewardFn, kwargs: dict[str, Any], timeout_s: float | None) -> Any:
        # A file-spec function is loaded again by spec in the worker (its module is not importable
        # by name there); others travel pickled, by reference.
        target = fn.spec or fn.fn
        kwargs = {k: v for k, v in kwargs.items() if k != "tools"}  # only there through **kwargs
        async with self._slots.get():
            worker = self._idle.pop() if self._idle else await self._spawn()
            try:
                worker.conn.send((target, kwargs))
            except (OSError, ValueError, pickle.PicklingError, AttributeError, TypeError) as exc:
                self._idle.append(worker)
                raise WorkerError(f"the reward's arguments cannot be sent to a worker process: {exc}") from None
            try:
                answered = await _readable(worker, timeout_s)
            except asyncio.CancelledError:
                self._discard(worker)  # it is still running the call nobody waits for
                raise
            if not answered:
                self._discard(worker)
                raise RewardTimeout(f"timed out after reward.timeout_s={timeout_s:g}s (its worker process "
                                    "group was killed)")
            try:
                status, payload = worker.conn.recv()
            except (EOFError, OSError):
                worker.process.join(1)
                code = worker.process.exitcode
                self._discard(worker)
                raise WorkerError(f"the reward's worker process died (exit code {code}: a crash, os._exit or "
                                  "out of memory)") from None
            except Exception as exc:  # noqa: BLE001 - a result or exception that does not unpickle here
                self._idle.append(worker)
                raise WorkerError(f"the reward's result cannot be read back: {type(exc).__name__}: {exc}") from None
        self._idle.append(worker)
        if status == "error":
            raise payload
        return payload

    async def _spawn(self) -> _Worker:
        worker = _Worker()
        self._workers.add(worker)
        if not await _readable(worker, WORKER_START_TIMEOUT_S) or worker.conn.recv() != ("ready", None):
            self._discard(worker)
            raise WorkerError(f"a reward worker process did not start within {WORKER_START_TIMEOUT_S:g}s")
        return worker

    def _discard(self, worker: _Worker) -> None:
        self._workers.discard(worker)
        if worker in self._idle:
            self._idle.remove(worker)
        worker.kill()

    def close(self) -> None:
        for worker in list(self._workers):
            self._discard(worker)


WORKER_START_TIMEOUT_S = 120.0  # a spawned interpreter importing the reward's module


class WorkerError(RuntimeError):
    """A worker process failed underneath a reward call (not the reward's own exception)."""


class _Worker:
    """One spawned process and the pipe its calls and results travel on."""

    def __init__(self):
        ctx = multiprocessing.get_context("spawn")  # not fork: the trainer holds threads and a loop
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=_worker_main, args=(child,), daemon=True, name="reward-worker")
        self.process.start()
        child.close()

    def kill(self) -> None:
        try:
            os.killpg(self.process.pid, signal.SIGKILL)  # the worker leads its own group (setsid)
        except (ProcessLookupError, PermissionError):
            pass
        self.process.kill()
        self.process.join(5)
        self.conn.close()


async def _readable(worker: _Worker, timeout_s: float | None) -> bool:
    """Wait until the worker's pipe has a message (or EOF) or the process died; False on timeout."""
    if worker.conn.poll():
        return True
    loop = asyncio.get_running_loop()
    ready = loop.create_future()
    fds = [worker.conn.fileno(), worker.process.sentinel]
    for fd in fds:
        loop.add_reader(fd, lambda: ready.done() or ready.set_result(None))
    try:
        await asyncio.wait_for(ready, timeout_s)
        return True
    except (asyncio.TimeoutError, TimeoutError):
        return False
    finally:
        for fd in fds:
            loop.remove_reader(fd)


_LOADED: dict[str, Callable[..., Any]] = {}  # per worker process: spec -> function


def _worker_main(conn: multiprocessing.connection.Connection) -> None:
    os.setsid()  # its own process group: a timeout kills the reward's subprocesses with it
    _init_worker()
    conn.send(("ready", None))
    while True:
        try:
            target, kwargs = conn.recv()
        except (EOFError, OSError):
            return
        try:
            reply = ("ok", _call_in_worker(target, kwargs))
        except BaseException as exc:  # noqa: BLE001 - reported to the caller, never fatal here
            reply = ("error", exc)
        try:
            conn.send(reply)
        except Exception as exc:  # noqa: BLE001 - an unpicklable result or exception
            what = "result" if reply[0] == "ok" else f"{type(reply[1]).__name__}: {reply[1]}"
            conn.send(("error", WorkerError(f"the reward's {what} cannot be sent back: {exc}")))


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
    return call_contained(target, **kwargs)


async def _call_async(fn: Callable[..., Any], kwargs: dict[str, Any]) -> Any:
    return await fn(**kwargs)


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
