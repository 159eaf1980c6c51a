"""The actor's cached GPU memory across a weight sync: released as verl does, or kept (`actor_cache_at_sync`).

verl's colocated weight sync (`ActorRolloutRefWorker.update_weights`, engine_workers.py, verl 0.9.1) empties the
actor process's CUDA cache before it resumes vLLM's weights and again after the sync, and its bucket sender empties
it once more (bucketed_weight_transfer.py). That hands the update's activations and gradients back to the driver
so that vLLM, woken from sleep, can map its weights and KV cache. With vLLM kept awake
(`actor_rollout_ref.rollout.free_cache_engine=false`, tuning.py's choice where it fits) and the actor's parameters
on the GPU, nothing is mapped: vLLM's memory was never released. The cache is then handed back and taken again
every step: py-spy on the FSDP worker (one H200, the 0.6B shape, 16 x 8) found 27 of the sync's 50 samples in
`torch.cuda.empty_cache()`, and the next update allocates all its memory from the driver again.

`actor_cache_at_sync: keep` (configs/verl.yaml) runs verl's own `update_weights` with the cache's emptying skipped,
where nothing needs the memory: vLLM awake, the actor's parameters not offloaded, the colocated (`naive`) sync.
Anywhere else verl's behaviour is unchanged. verl's trainer picks the worker class in `_init_resource_pool_mgr`,
as its own separate_async trainer does to swap in its DetachActorWorker; `KeepCache` in front of the trainer swaps
in `CacheKeepingWorker`, verl's worker with that one method wrapped. `keep` is the default: on one H200 (the 0.6B
shape, 16 x 8, vLLM awake, `bash benchmarks/gpu_suite.sh ab actor_cache_at_sync=keep` at a `release` default) the
sync took 0.09 s instead of 0.20 and the update 0.85 s instead of 1.03, medians of steps 2-5 of one invocation.
"""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from rl_factory.config import ConfigError

KEY = "actor_cache_at_sync"
MODES = ("release", "keep")


def mode(cfg: Any) -> str:
    """`actor_cache_at_sync` of the composed verl config; anything but MODES is refused with one line."""
    value = cfg.get(KEY, "keep")
    if value not in MODES:
        raise ConfigError(f"{KEY}={value!r}: expected one of {', '.join(MODES)} (configs/verl.yaml)")
    return value


def kept_here(free_cache_engine: bool, param_offload: bool, sync_mode: str) -> bool:
    """Whether a sync may keep the cache: vLLM awake, parameters on the GPU, the colocated in-process sync."""
    return not free_cache_engine and not param_offload and sync_mode == "naive"


@contextmanager
def empty_cache_skipped(device: Any) -> Iterator[list[int]]:
    """`device.empty_cache` (torch.cuda, as verl's `get_torch_device()` returns it) does nothing inside; yields a
    one-item list counting the calls skipped. Restored on the way out, whatever happens inside."""
    skipped = [0]
    original = device.empty_cache

    def skip() -> None:
        skipped[0] += 1

    device.empty_cache = skip
    try:
        yield skipped
    finally:
        device.empty_cache = original


def worker_class() -> type:
    """verl's ActorRolloutRefWorker with `update_weights` keeping the cache where `kept_here` allows (defined on
    first use: importing verl's workers is heavy; Ray ships the class to the workers by value)."""
    from verl.single_controller.base.decorator import Dispatch, register
    from verl.utils.device import get_torch_device
    from verl.workers.engine_workers import ActorRolloutRefWorker

    class CacheKeepingWorker(ActorRolloutRefWorker):
        # the same registration as verl's method: the worker group binds it by this decoration
        @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
        async def update_weights(self, global_steps: int = None, mode: str = "auto"):
            sync_mode = mode if mode != "auto" else self.config.rollout.checkpoint_engine.backend
            if not kept_here(bool(self.config.rollout.free_cache_engine),
                             bool(self.actor.engine.is_param_offload_enabled), sync_mode):
                return await super().update_weights(global_steps=global_steps, mode=mode)
            with empty_cache_skipped(get_torch_device()):
                return await super().update_weights(global_steps=global_steps, mode=mode)

    return CacheKeepingWorker


class KeepCache:
    """In front of verl's trainer: its actor (and rollout) worker is `CacheKeepingWorker` (module docstring)."""

    def _init_resource_pool_mgr(self):
        import ray
        from verl.workers.engine_workers import ActorRolloutRefWorker

        super()._init_resource_pool_mgr()
        keeping = ray.remote(worker_class())
        for role, remote in list(self.role_worker_mapping.items()):
            # only verl's own class: a trainer that swapped in its own worker (separate_async's) keeps it
            if getattr(remote, "__ray_metadata__", None) and \
                    remote.__ray_metadata__.modified_class.__ray_actor_class__ is ActorRolloutRefWorker:
                self.role_worker_mapping[role] = keeping


def use_keep_cache(trainer_mode: str) -> type:
    """Put KeepCache in front of the trainer registered as `trainer_mode` (idempotent); returns the class now there."""
    from rl_factory.backends.verl.trainer_front import put_in_front

    return put_in_front(trainer_mode, KeepCache)
