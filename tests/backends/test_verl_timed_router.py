"""The rollout's server class imported ahead of the servers' handles (rl_factory/backends/verl/timed_router.py): a
process given a Ray actor handle loads the actor's class, and verl's vLLM server class lives in the module that
imports vLLM; prestart.py has the router and the agent-loop workers import it while the servers start."""
from __future__ import annotations

import pytest

pytest.importorskip("verl", reason="verl is an extra")


def test_the_server_class_is_imported_through_verls_replica_registry_and_a_failure_is_reported():
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    from rl_factory.backends.verl.prestart import rollout_server
    from rl_factory.backends.verl.timed_router import TimedRouter, preload_server_class

    loaded = []
    RolloutReplicaRegistry.register("rl_factory_test", lambda: loaded.append("replica") or object)
    try:
        assert preload_server_class("rl_factory_test") >= 0 and loaded == ["replica"]
        router = TimedRouter(servers={})
        assert router.preload("rl_factory_test") >= 0 and loaded == ["replica", "replica"]
        # a rollout the registry does not know: what failed, returned to the caller (prestart logs it), not raised
        assert router.preload("no_such_rollout").startswith("ValueError: Unknown rollout mode: no_such_rollout")
    finally:
        RolloutReplicaRegistry._registry.pop("rl_factory_test")

    from omegaconf import OmegaConf

    cfg = OmegaConf.create({"actor_rollout_ref": {"rollout": {"name": "vllm"}}})
    assert rollout_server(cfg) == ("vllm", False)
    OmegaConf.update(cfg, "actor_rollout_ref.rollout.disaggregation", {"enabled": True})
    assert rollout_server(cfg) == ("vllm", True)
