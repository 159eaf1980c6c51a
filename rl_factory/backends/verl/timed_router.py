"""verl's default request router, which also says when it was built (prestart.py starts it early), and the import
of the rollout's server class that prestart.py gets done in the router's and the agent-loop workers' processes
before they are handed the servers.

A module of its own, importing only verl's router: Ray imports the actor's class by its module path in the router's
own process, and prestart.py's module would bring verl's agent loop and TransferQueue with it.

Why the import: a process given a Ray actor handle loads the actor's class to make it (Ray's function manager,
`load_actor_class`: the class pickled by reference, so its module is imported). verl's server class lives in the
module of its vLLM replica, which imports vLLM: the router took 4.4-4.6 s to take its servers on an H100
(`beside.router_add_servers`, ff5d6b6e84f3), on the launch's path, and each agent-loop worker pays the same when it
is first handed a server's handle (its clients at `attach`, the router's answer to its first request).
"""
from __future__ import annotations

import time
from typing import Any

from verl.workers.rollout.router import GlobalRequestLoadBalancer


def preload_server_class(rollout: str, disaggregation: bool = False) -> float:
    """Import the module of the rollout's server class (verl's replica registry, `actor_rollout_ref.rollout.name`)
    in this process; the seconds it took."""
    from verl.workers.rollout.replica import get_rollout_replica_class

    began = time.perf_counter()
    get_rollout_replica_class(rollout, disaggregation)
    return time.perf_counter() - began


class TimedRouter(GlobalRequestLoadBalancer):
    """`GlobalRequestLoadBalancer` as verl builds it, plus `built_at`: with the router's first answer, the start-up
    record says whether a router that answered late was late to start (Ray, its process) or late to answer."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.built = time.time()

    def built_at(self) -> float:
        return self.built

    def preload(self, rollout: str, disaggregation: bool = False) -> float | str:
        """`preload_server_class` here: its seconds, or what failed (the servers' handles will fail the same way
        when they come, and say so there)."""
        try:
            return preload_server_class(rollout, disaggregation)
        except Exception as exc:  # noqa: BLE001 - reported to the caller, which logs it
            return f"{type(exc).__name__}: {exc}"
