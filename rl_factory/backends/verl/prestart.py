"""Agent-loop workers started with the TaskRunner, not after vLLM's servers are up.

verl creates its agent-loop workers (`agent.num_workers` Ray actors, each a process that imports torch, verl and
our loop, loads the tokenizer and the agent-loop registry) only once the trainer is built: after TransferQueue,
the FSDP actor and vLLM's servers, one after another. A step's rollout then waits for their processes to start
(step 1's `first_prepare`, 10-16 s of a 0.6B launch on the H200). Nothing in those processes needs the servers
until a trajectory asks for tokens: only the LLM client, the teacher client and the reward workers' handles come
from the trainer.

So our TaskRunner starts them first (`start`), as verl's manager would (the same class, names and node
spreading), built without those three, and names `PrestartedAgentLoopManager` as verl's agent-loop manager class
(`actor_rollout_ref.rollout.agent.agent_loop_manager_class`, verl's own extension point). When verl's TaskRunner
builds the manager, it hands the started workers the clients (`attach`) instead of starting new ones. Their start
overlaps TransferQueue's, the actor's and vLLM's.

Not started early: a run that names its own manager class (its workers are its own), or distills from a teacher
(verl's worker builds the teacher's client into its state at construction).
"""
from __future__ import annotations

import asyncio
import logging
from typing import Any
from uuid import uuid4

import ray
from omegaconf import DictConfig, open_dict
from verl.experimental.agent_loop.agent_loop import AgentLoopWorker
from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopManagerTQ, AgentLoopWorkerTQ

log = logging.getLogger("rl_factory.verl")

MANAGER = f"{__name__}.PrestartedAgentLoopManager"
MANAGER_KEY = "actor_rollout_ref.rollout.agent.agent_loop_manager_class"
_started: list[Any] = []  # in the TaskRunner's process: the workers `start` created, until the manager takes them


class _Worker(AgentLoopWorkerTQ.__ray_metadata__.modified_class.__ray_actor_class__):
    """verl's AgentLoopWorkerTQ, built in two parts: all of it but the clients at start, the clients at `attach`."""

    def __init__(self, config: DictConfig):
        AgentLoopWorker.__init__(self, config, llm_client=None)  # no TransferQueue yet: the TaskRunner starts it
        import rl_factory.backends.verl.agent_loop  # noqa: F401 - our loop's modules, imported before the first batch

        self.background_tasks = set()

    def attach(self, llm_client: Any, teacher_client: Any, reward_loop_worker_handles: Any) -> int:
        """What verl's constructor would have been given, and TransferQueue's client (AgentLoopWorkerTQ's)."""
        import os

        import transfer_queue as tq

        self.llm_client, self.teacher_client = llm_client, teacher_client
        self.reward_loop_worker_handles = reward_loop_worker_handles
        if self.rollout_config.trace.get("token2text", False):
            self.llm_client.tokenizer = self.tokenizer
        tq.init()
        return os.getpid()


PrestartedWorker = ray.remote(_Worker)


def wanted(config: DictConfig) -> bool:
    """Whether this run's workers can start before the trainer is built (the module docstring)."""
    from omegaconf import OmegaConf

    agent = OmegaConf.select(config, "actor_rollout_ref.rollout.agent") or {}
    distillation = config.get("distillation") or {}
    return not agent.get("agent_loop_manager_class") and not distillation.get("enabled", False) \
        and int(agent.get("num_workers", 0) or 0) > 0


def start(config: DictConfig) -> int:
    """In the TaskRunner, before the trainer: start the agent-loop workers and name our manager to take them.

    `config` is the TaskRunner's, resolved here as verl's `run` resolves it (TransferQueue on), so that the workers
    get the config verl's manager would have given them. Returns how many were started (0: verl starts its own)."""
    from omegaconf import OmegaConf

    if not wanted(config):
        return 0
    with open_dict(config):
        config.transfer_queue.enable = True  # as verl's TaskRunner sets it before resolving (main_ppo.run)
        OmegaConf.update(config, MANAGER_KEY, MANAGER, merge=False)
    OmegaConf.resolve(config)
    nodes = [n["NodeID"] for n in ray.nodes() if n["Alive"] and n["Resources"].get("CPU", 0) > 0]
    count = int(config.actor_rollout_ref.rollout.agent.num_workers)
    _started[:] = [
        PrestartedWorker.options(  # verl's placement: round robin over the nodes with CPUs, soft
            name=f"agent_loop_worker_{i}_{uuid4().hex[:8]}",
            scheduling_strategy=ray.util.scheduling_strategies.NodeAffinitySchedulingStrategy(
                node_id=nodes[i % len(nodes)], soft=True),
        ).remote(config)
        for i in range(count)]
    log.info("verl: %d agent-loop workers starting beside the trainer's start", count)
    return count


def take() -> list[Any]:
    """The workers `start` created (once; empty where none were)."""
    workers, _started[:] = list(_started), []
    return workers


class PrestartedAgentLoopManager(AgentLoopManagerTQ):
    """verl's AgentLoopManagerTQ over the workers our TaskRunner started (`start`); verl's own start where none."""

    async def _init_agent_loop_workers(self):
        workers = take()
        if len(workers) != int(self.rollout_config.agent.num_workers):
            for worker in workers:
                ray.kill(worker)
            return await super()._init_agent_loop_workers()
        await asyncio.gather(*[
            w.attach.remote(self.llm_client, self.teacher_client, self.reward_loop_worker_handles) for w in workers])
        self.agent_loop_workers = workers
