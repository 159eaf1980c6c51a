"""`actor_cache_at_sync` (rl_factory/backends/verl/actor_cache.py): verl's trainer gets the cache-keeping actor
worker only with `keep`; the worker skips `empty_cache` inside verl's own `update_weights` only where nothing needs
the memory (vLLM awake, parameters on the GPU, the colocated sync), and puts `empty_cache` back whatever happens.
On CPU: verl's real trainer class builds its worker mapping from a composed config; verl's `update_weights`, which
needs a GPU and a vLLM server, is replaced by one that records what `empty_cache` does while it runs."""
from __future__ import annotations

import asyncio
import types

import pytest

pytest.importorskip("verl", reason="verl is an extra")

from rl_factory.backends.verl import actor_cache  # noqa: E402
from rl_factory.config import ConfigError  # noqa: E402


def verl_config(tmp_path, model_dir, *extra):
    from rl_factory.backends.verl.config import compose_verl
    from rl_factory.backends.verl.launcher import absolute
    from rl_factory.config import load_config, parse, split_overrides

    ours, raw = split_overrides(["trainer.backend=verl", "trainer.n_gpus_per_node=1", *extra])
    return compose_verl(absolute(parse(load_config("grpo", ours))), raw,
                        {"train": "/d/train.parquet", "val": "/d/val.parquet"}, str(model_dir))


def mapped_classes(trainer_cls, cfg) -> dict:
    trainer = object.__new__(trainer_cls)  # only the worker mapping: no Ray, no GPU
    trainer.config = cfg
    trainer._init_resource_pool_mgr()
    return {role: remote.__ray_metadata__.modified_class.__ray_actor_class__
            for role, remote in trainer.role_worker_mapping.items()}


@pytest.mark.slow  # composes verl's config
def test_keep_swaps_in_the_cache_keeping_worker_and_release_keeps_verls(tmp_path, tiny_model_dir):
    from verl.trainer.ppo.v1 import trainer_base
    from verl.workers.engine_workers import ActorRolloutRefWorker

    cfg = verl_config(tmp_path, tiny_model_dir, "actor_cache_at_sync=keep")
    assert actor_cache.mode(cfg) == "keep"
    base = trainer_base.get_trainer_cls("sync")
    keeping = type("KeepCacheProbe", (actor_cache.KeepCache, base), {})
    kept = mapped_classes(keeping, cfg)
    verls = mapped_classes(base, cfg)
    actor_roles = [role for role, cls in verls.items() if cls is ActorRolloutRefWorker]
    assert actor_roles, verls
    for role in actor_roles:
        assert kept[role] is not ActorRolloutRefWorker and issubclass(kept[role], ActorRolloutRefWorker)
    assert {r: c for r, c in kept.items() if r not in actor_roles} == {r: c for r, c in verls.items()
                                                                      if r not in actor_roles}


def test_a_bad_value_is_refused_in_one_line():
    with pytest.raises(ConfigError, match=r"actor_cache_at_sync='sometimes': expected one of release, keep"):
        actor_cache.mode({"actor_cache_at_sync": "sometimes"})
    assert actor_cache.mode({}) == "keep"


@pytest.mark.parametrize("free_cache_engine, offload, backend, kept", [
    (False, False, "naive", True),
    (True, False, "naive", False),   # vLLM sleeps: its memory is mapped again at the sync
    (False, True, "naive", False),   # parameters offloaded: verl moves them and frees their memory
    (False, False, "nccl", False),   # a disaggregated sync: verl's checkpoint engine path, untouched
])
def test_the_worker_skips_empty_cache_only_where_nothing_needs_the_memory(monkeypatch, free_cache_engine, offload,
                                                                          backend, kept):
    import torch
    from omegaconf import OmegaConf
    from verl.workers.engine_workers import ActorRolloutRefWorker

    released = []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: released.append(1))  # no GPU here: count the releases
    torchs = torch.cuda.empty_cache

    async def verls_update_weights(self, global_steps=None, mode="auto"):
        torch.cuda.empty_cache()  # before the sync and after it, as verl's does
        torch.cuda.empty_cache()
        return {"step": global_steps, "mode": mode}

    monkeypatch.setattr(ActorRolloutRefWorker, "update_weights", verls_update_weights)
    worker = object.__new__(actor_cache.worker_class())
    worker.config = OmegaConf.create({"rollout": {"free_cache_engine": free_cache_engine,
                                                  "checkpoint_engine": {"backend": backend}}})
    worker.actor = types.SimpleNamespace(engine=types.SimpleNamespace(is_param_offload_enabled=offload))
    assert asyncio.run(worker.update_weights(global_steps=3)) == {"step": 3, "mode": "auto"}
    assert len(released) == (0 if kept else 2)
    assert torch.cuda.empty_cache is torchs


def test_empty_cache_comes_back_when_the_sync_raises():
    device = types.SimpleNamespace(empty_cache=lambda: "torch's")
    before = device.empty_cache
    with pytest.raises(RuntimeError):
        with actor_cache.empty_cache_skipped(device) as skipped:
            device.empty_cache()
            device.empty_cache()
            raise RuntimeError("the sync failed")
    assert skipped == [2] and device.empty_cache is before and device.empty_cache() == "torch's"
