"""TransferQueue started beside the trainer's build instead of before it.

verl's TaskRunner starts TransferQueue (`tq.init`: its controller, then its storage units, each a Ray actor process
that imports torch and TransferQueue) and only then builds the trainer: 13-16 s of a 0.6B launch on the H200 in
which nothing else starts. Nothing the build does before the agent-loop manager reads or writes TransferQueue: the
actor, reward and vLLM workers reach it only when a step hands them a batch, and the agent-loop workers attach to
it in their constructor. The one exception is a resumed run, whose checkpoint load restores TransferQueue's state.

So our TaskRunner (runner.py) runs verl's `TaskRunnerV1.run` with `tq.init` in a thread (`Background`) and waits
for it where TransferQueue is first needed: before the checkpoint load (startup.StartupTrainer), before the agent
loop manager, and before `tq.close`. `run` is verl 0.9.1's, step for step; test_verl_startup.py compares it with
verl's source.
"""
from __future__ import annotations

import threading
import time
from pprint import pprint
from typing import Any

from omegaconf import OmegaConf

_pending: Background | None = None  # this process's TransferQueue start, while one runs or until it is waited for


class Background:
    """`tq.init(conf)` in a thread; `wait()` returns once it finished, or raises what it raised."""

    def __init__(self, conf: Any):
        import transfer_queue as tq

        self.error: BaseException | None = None
        self.started, self.seconds = time.time(), None
        self.thread = threading.Thread(target=self._init, args=(tq.init, conf), name="transfer-queue-init", daemon=True)
        self.thread.start()

    def _init(self, init: Any, conf: Any) -> None:
        try:
            init(conf)
        except BaseException as exc:  # noqa: BLE001 - raised again by wait(), in the TaskRunner's own thread
            self.error = exc
        finally:
            self.seconds = round(time.time() - self.started, 3)

    def wait(self) -> None:
        self.thread.join()
        if self.error is not None:
            raise self.error


def ready() -> None:
    """Wait for this process's TransferQueue start, where one runs (nothing otherwise)."""
    if _pending is not None:
        _pending.wait()


def seconds() -> float | None:
    """How long this process's TransferQueue start took, once it finished."""
    return None if _pending is None else _pending.seconds


def run(runner: Any, config: Any) -> None:
    """verl's `TaskRunnerV1.run(config)` on `runner` (verl.trainer.main_ppo), TransferQueue started in the
    background: the same statements in the same order, but `tq.init` does not block the trainer's build."""
    global _pending
    import transfer_queue as tq
    from verl.trainer.ppo.v1 import get_trainer_cls
    from verl.utils.logging_utils import configure_verl_logging

    configure_verl_logging()
    trainer_cls = get_trainer_cls(config.trainer.v1.trainer_mode)

    config.transfer_queue.enable = True
    pprint(OmegaConf.to_container(config, resolve=True))
    OmegaConf.resolve(config)
    runner.config = config

    _pending = Background(config.transfer_queue)
    succeeded = False
    try:
        runner.trainer = trainer_cls(config=config)
        runner.trainer.init()
        ready()
        runner.init_agent_loop_manager()
        runner.trainer.fit(runner.agent_loop_manager)
        succeeded = True
    finally:
        try:
            tracking = getattr(runner.trainer, "logger", None)
            if tracking is not None:
                tracking.finish(exit_code=0 if succeeded else 1)
        finally:
            try:
                _pending.thread.join()  # close what it started, whether or not it failed
            finally:
                tq.close()
