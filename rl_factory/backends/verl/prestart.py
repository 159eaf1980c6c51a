"""The agent-loop workers and verl's request router, started with the TaskRunner, not after vLLM's servers.

verl creates its agent-loop workers (`agent.num_workers` Ray actors, each a process that imports torch, verl and
our loop, loads the tokenizer and the agent-loop registry) only once the trainer is built: after TransferQueue,
the FSDP actor and vLLM's servers, one after another. The same goes for the request router every generation goes
through (verl's `GlobalRequestLoadBalancer`, one more Ray actor process, created once the servers are up). Step 1's
rollout waits for both: the first request reached vLLM 18-22 s after training began in each 0.6B launch on an H100
at `4e8b87de98f5`, every trajectory's first generate call waiting on the router's process. Nothing in those
processes needs the servers until a trajectory asks for tokens: the workers need only the LLM client, the teacher
client and the reward workers' handles from the trainer, and the router starts empty (verl's own hybrid scaling
adds servers to it later the same way).

So our TaskRunner starts them first (`start`; the asking, and the wait for the router's first answer that the
start-up record reports, in a thread off its path), as verl would (the same classes, names and node spreading), and
- names `PrestartedAgentLoopManager` as verl's agent-loop manager class (`agent.agent_loop_manager_class`, verl's
  own extension point): when verl's TaskRunner builds the manager, it hands the started workers the clients
  (`attach`) instead of starting new ones;
- puts `PrestartedRouter` in front of the trainer: when the trainer's server manager is built, the started router
  gets its servers and takes the place of the one verl just created, before any client is made from it.

Not started early: workers, where a run names its own manager class or distills from a teacher (verl's worker
builds the teacher's client into its state at construction); the router, where a run names its own
(`rollout.router_config_path`) or its trainer serves rollouts from servers of its own (`separate_async`).
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Any
from uuid import uuid4

import ray
from omegaconf import DictConfig, OmegaConf, open_dict
from verl.experimental.agent_loop.agent_loop import AgentLoopWorker, DictConfigWrap, ToolListWrap, _agent_loop_registry
from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopManagerTQ, AgentLoopWorkerTQ
from verl.utils.rollout_trace import rollout_trace_attr
from verl.workers.rollout.router import DEFAULT_ROUTING_CACHE_SIZE

from rl_factory.backends.verl import startup
from rl_factory.backends.verl.timed_router import TimedRouter, preload_server_class

log = logging.getLogger("rl_factory.verl")

MANAGER = f"{__name__}.PrestartedAgentLoopManager"
OUR_LOOP = "rl_factory.backends.verl.agent_loop.RLFactoryAgentLoop"  # our loop's `_target_` (agent_loop.yaml)
MANAGER_KEY = "actor_rollout_ref.rollout.agent.agent_loop_manager_class"
ROUTER_MODES = ("sync", "colocate_async")  # trainers whose rollouts go through the server manager's own router


class _Started:
    """In the TaskRunner's process: what `start` asked Ray for, once its thread has finished."""

    def __init__(self):
        self.thread: threading.Thread | None = None
        self.workers: list[Any] = []
        self.router: Any = None
        self.router_ready_s: float | None = None  # from asking Ray for the router to its first answer
        self.router_built_s: float | None = None  # from asking to its constructor's end, in its own process
        self.router_preload_s: float | None = None  # the server class's import in the router (timed_router.py)

    def join(self) -> None:
        if self.thread is not None:
            self.thread.join()
            self.thread = None


_started = _Started()


class AgentLoopWorkerPrestarted(AgentLoopWorkerTQ.__ray_metadata__.modified_class.__ray_actor_class__):
    """verl's AgentLoopWorkerTQ, built in two parts: all of it but the clients at start, the clients at `attach`.
    (Ray names the process after the class, "ray::AgentLoopWorkerPrestarted": benchmarks/pyspy_watch.py finds the
    agent-loop worker by that name.)"""

    def __init__(self, config: DictConfig):
        AgentLoopWorker.__init__(self, config, llm_client=None)  # no TransferQueue yet: the TaskRunner starts it
        import rl_factory.backends.verl.agent_loop  # noqa: F401 - our loop's modules, imported before the first batch

        # the server class the servers' handles need (timed_router.py), imported here, before any handle comes
        try:
            preload_server_class(*rollout_server(config))
        except Exception:  # noqa: BLE001 - the handles' own loading says what is wrong, where it matters
            log.warning("verl: the rollout's server class did not import ahead of the servers' handles", exc_info=True)

        self.background_tasks = set()

    async def _run_agent_loop(self, sampling_params: dict[str, Any], trajectory: dict[str, Any], *, agent_name: str,
                              trace: bool = True, **kwargs: Any) -> Any:
        """verl's own, with our loop built directly where the registry names it. verl builds each trajectory's loop
        with `hydra.utils.instantiate`, which merges its arguments into an OmegaConf node first: 22% of the
        agent-loop worker's busy time in a CPU profile (benchmarks/verl_loop_overhead.py), and each trajectory's
        build delays the next one's start, and its first request to vLLM, in the worker's event loop."""
        if (_agent_loop_registry.get(agent_name) or {}).get("_target_") != OUR_LOOP:
            return await super()._run_agent_loop(sampling_params, trajectory, agent_name=agent_name, trace=trace,
                                                 **kwargs)
        from rl_factory.backends.verl.agent_loop import RLFactoryAgentLoop  # imported at __init__: a lookup here

        with rollout_trace_attr(step=trajectory["step"], sample_index=trajectory["sample_index"],
                                rollout_n=trajectory["rollout_n"], validate=trajectory["validate"], name="agent_loop",
                                trace=trace):
            loop = RLFactoryAgentLoop(trainer_config=DictConfigWrap(config=self.config), server_manager=self.llm_client,
                                      tokenizer=self.tokenizer, processor=self.processor,
                                      hf_model_type=self.hf_model_type, dataset_cls=self.dataset_cls,
                                      data_config=DictConfigWrap(self.config.data), tools=ToolListWrap(self.tools))
            output = await loop.run(sampling_params, **kwargs)
            return await self._agent_loop_postprocess(output, trajectory["validate"], **kwargs)

    def attach(self, llm_client: Any, teacher_client: Any, reward_loop_worker_handles: Any) -> None:
        """What verl's constructor would have been given, and TransferQueue's client (AgentLoopWorkerTQ's)."""
        import transfer_queue as tq

        self.llm_client, self.teacher_client = llm_client, teacher_client
        self.reward_loop_worker_handles = reward_loop_worker_handles
        if self.rollout_config.trace.get("token2text", False):
            self.llm_client.tokenizer = self.tokenizer
        tq.init()


PrestartedWorker = ray.remote(AgentLoopWorkerPrestarted)


def rollout_server(config: DictConfig) -> tuple[str, bool]:
    """The rollout's name in verl's replica registry, and whether it is disaggregated (prefill / decode)."""
    rollout = config.actor_rollout_ref.rollout
    return str(rollout.name), bool(OmegaConf.select(rollout, "disaggregation.enabled", default=False))


def wanted(config: DictConfig) -> bool:
    """Whether this run's workers can start before the trainer is built (the module docstring)."""
    agent = OmegaConf.select(config, "actor_rollout_ref.rollout.agent") or {}
    distillation = config.get("distillation") or {}
    return (not agent.get("agent_loop_manager_class") and not distillation.get("enabled", False)
            and int(agent.get("num_workers", 0) or 0) > 0)


def router_wanted(config: DictConfig) -> bool:
    """Whether this run's request router can start before the servers (the module docstring)."""
    return (OmegaConf.select(config, "trainer.v1.trainer_mode") in ROUTER_MODES
            and not OmegaConf.select(config, "actor_rollout_ref.rollout.router_config_path"))


def start(config: DictConfig) -> int:
    """In the TaskRunner, before the trainer: start the agent-loop workers (and the request router) and name our
    manager to take them.

    `config` is the TaskRunner's, resolved here as verl's `run` resolves it (TransferQueue on), so that the workers
    get the config verl's manager would have given them. Returns how many workers are starting (0: verl starts its
    own, and its router)."""
    if not wanted(config):
        return 0
    with open_dict(config):
        config.transfer_queue.enable = True  # as verl's TaskRunner sets it before resolving (main_ppo.run)
        OmegaConf.update(config, MANAGER_KEY, MANAGER, merge=False)
    OmegaConf.resolve(config)
    count, router = int(config.actor_rollout_ref.rollout.agent.num_workers), router_wanted(config)
    if router:
        from rl_factory.backends.verl.trainer_front import put_in_front

        put_in_front(config.trainer.v1.trainer_mode, PrestartedRouter)
    # put in Ray's object store here, once (verl's run goes on with `config` meanwhile), not pickled for each worker
    shared = ray.put(config)
    determinism = bool(config.actor_rollout_ref.rollout.get("full_determinism", False)) if router else None
    _started.thread = threading.Thread(target=_create, args=(shared, count, determinism, rollout_server(config)),
                                       name="prestart", daemon=True)
    _started.thread.start()
    log.info("verl: %d agent-loop workers%s starting beside the trainer's start", count,
             " and the request router" if router else "")
    return count


def _create(shared: Any, count: int, determinism: bool | None, server: tuple[str, bool]) -> None:
    """The actors `start` asks for, in its thread, off the TaskRunner's path: `count` workers built from the config in
    `shared`, and the router where `determinism` is not None (verl's `full_determinism` for it). A failure leaves
    verl to start its own.

    The thread then waits for the router's first answer, so that the start-up record can say how long it took to
    come up (`beside.request_router`) beside how long the trainer waited for it (the `router_adopt` phase), and for
    the router's import of the rollout's server class (`beside.router_preload`)."""
    try:
        nodes = [n["NodeID"] for n in ray.nodes() if n["Alive"] and n["Resources"].get("CPU", 0) > 0]
        asked = time.time()
        if determinism is not None:  # verl's default router (router.py _create_global_sticky_inflight), no servers yet
            _started.router = ray.remote(TimedRouter).remote(
                servers={}, max_cache_size=DEFAULT_ROUTING_CACHE_SIZE, full_determinism=determinism)
        _started.workers = [
            PrestartedWorker.options(  # verl's placement: round robin over the nodes with CPUs, soft
                name=f"agent_loop_worker_{i}_{uuid4().hex[:8]}",
                scheduling_strategy=ray.util.scheduling_strategies.NodeAffinitySchedulingStrategy(
                    node_id=nodes[i % len(nodes)], soft=True),
            ).remote(shared)
            for i in range(count)]
    except Exception:  # noqa: BLE001 - the start-up's own path remains
        log.exception("verl: starting the agent-loop workers early failed; verl starts its own")
        _started.workers, _started.router = [], None
        return
    if _started.router is not None:
        try:
            built = ray.get(_started.router.built_at.remote())
            _started.router_ready_s = round(time.time() - asked, 3)
            _started.router_built_s = round(built - asked, 3)
        except Exception:  # noqa: BLE001 - verl's server manager keeps the router it creates
            log.exception("verl: the request router started early did not come up; verl's own is used")
            _started.router = None
            return
        # the server class the servers' handles need, imported before they are handed over (timed_router.py)
        try:
            took = ray.get(_started.router.preload.remote(*server))
        except Exception as exc:  # noqa: BLE001 - the hand-over will load it itself
            took = f"{type(exc).__name__}: {exc}"
        if isinstance(took, str):
            log.warning("verl: the rollout's server class did not import in the request router: %s", took)
        else:
            _started.router_preload_s = round(took, 3)


def take() -> list[Any]:
    """The workers `start` created (once; empty where none were)."""
    _started.join()
    workers, _started.workers = list(_started.workers), []
    return workers


def adopt_router(manager: Any) -> bool:
    """The router `start` created, given `manager`'s servers, in place of the one `manager` (verl's LLMServerManager,
    just built) created; verl's is stopped. False where none was started."""
    _started.join()
    router, _started.router = _started.router, None
    if router is None:
        return False
    startup.beside("request_router", _started.router_ready_s)
    startup.beside("request_router_built", _started.router_built_s)
    startup.beside("router_preload", _started.router_preload_s)
    # each call timed on its own: the hand-over took 4.4-7.0 s on a GPU host, 10 ms in a CPU simulation
    began = time.time()
    ray.get(router.add_servers.remote(dict(zip(manager.server_addresses, manager.server_handles, strict=True))))
    added = time.time()
    replaced, manager.global_load_balancer = manager.global_load_balancer, router
    ray.kill(replaced)
    startup.beside("router_add_servers", round(added - began, 3))
    startup.beside("router_kill_verls", round(time.time() - added, 3))
    return True


class PrestartedRouter:
    """In front of a verl V1 trainer: the server manager it builds routes through the router `start` created."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "llm_server_manager" and value is not None:
            startup.mark("rollout_servers_started")  # the servers are up; what follows is the router's hand-over
            adopt_router(value)
            startup.mark("router_adopted")
        super().__setattr__(name, value)


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
