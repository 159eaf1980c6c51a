"""Our TaskRunner: verl's `TaskRunnerV1` with its trainer class wrapped in this process, on every verl run.

verl's run_ppo starts the TaskRunner actor class it is given and calls its `run(config)`, which looks the trainer
up in verl's trainer registry (`trainer.v1.trainer_mode`), builds it, starts the agent-loop manager and fits. Ours
puts, in the TaskRunner's own process (the registry is per process), a class in front of the mode's trainer:
`StartupTrainer` always (startup.py: where the minutes before the first step go, `startup.json`), `NarrowFetch`
with `worker_fetch: needed` (fetch.py), `TrainedBatch` with the run guard's tokens check on (trained.py: the
guard reads the batch the actor trains) and `KeepCache` with `actor_cache_at_sync: keep` (actor_cache.py). The
mode's name stays: verl's trainer branches on it. Before the trainer, it starts the agent-loop workers and the request
router, which verl would start only after vLLM's servers (prestart.py), and it runs verl's `run` with TransferQueue
started beside the trainer's build, not before it (transfer_queue_start.py).

`TaskRunnerV1` is a Ray actor class; Ray keeps the Python class it wraps on its modified class, which ours
subclasses (Ray refuses to subclass the actor class itself).
"""
from __future__ import annotations

from typing import Any

from rl_factory.backends.verl import startup


def use_trainer(trainer_mode: str, narrow_fetch: bool, guard_batch: bool = False,
                keep_cache: bool = False) -> type:
    """Put our classes in front of the trainer registered as `trainer_mode` (idempotent); returns the class now there."""
    from rl_factory.backends.verl import actor_cache, fetch, trained
    from rl_factory.backends.verl.trainer_front import put_in_front

    if keep_cache:
        actor_cache.use_keep_cache(trainer_mode)
    if narrow_fetch:
        fetch.use_narrow_fetch(trainer_mode)
    if guard_batch:  # outside NarrowFetch: it reads the batch as the update's own call hands it on
        trained.use_trained_batch(trainer_mode)
    return put_in_front(trainer_mode, startup.StartupTrainer, name="Startup")


def task_runner(base: Any, narrow_fetch: bool, guard_batch: bool = False, keep_cache: bool = False) -> Any:
    """verl's TaskRunner actor class `base` (TaskRunnerV1) with our trainer classes and start-up marks."""
    import ray

    wrapped = base.__ray_metadata__.modified_class.__ray_actor_class__

    class TaskRunner(wrapped):
        def __init__(self, marks: dict[str, float] | None = None):
            startup.task_runner_clock(marks)  # the launcher's marks (startup.StampedRunner), then ours
            super().__init__()

        def run(self, config):
            startup.write_to(config.get("rl_factory", {}).get("trainer", {}).get("output_dir"))
            startup.mark("task_runner_run")
            use_trainer(config.trainer.v1.trainer_mode, narrow_fetch, guard_batch, keep_cache)
            from rl_factory.backends.verl import prestart, transfer_queue_start

            if prestart.start(config):  # agent-loop workers and router start beside the trainer's build
                startup.mark("agent_loops_prestarted")
            try:  # verl's run, with TransferQueue started beside the trainer's build (transfer_queue_start.py)
                return transfer_queue_start.run(self, config)
            except BaseException as exc:
                startup.failed(exc)
                raise

        def init_agent_loop_manager(self):
            from rl_factory.backends.verl import transfer_queue_start

            startup.beside("transfer_queue", transfer_queue_start.seconds())
            super().init_agent_loop_manager()
            startup.mark("agent_loops_started")

    TaskRunner.__name__ = TaskRunner.__qualname__ = f"RLFactory{wrapped.__name__}"
    return ray.remote(TaskRunner)
