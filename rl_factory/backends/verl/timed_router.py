"""verl's default request router, which also says when it was built (prestart.py starts it early).

A module of its own, importing only verl's router: Ray imports the actor's class by its module path in the router's
own process, and prestart.py's module would bring verl's agent loop and TransferQueue with it.
"""
from __future__ import annotations

import time
from typing import Any

from verl.workers.rollout.router import GlobalRequestLoadBalancer


class TimedRouter(GlobalRequestLoadBalancer):
    """`GlobalRequestLoadBalancer` as verl builds it, plus `built_at`: with the router's first answer, the start-up
    record says whether a router that answered late was late to start (Ray, its process) or late to answer."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.built = time.time()

    def built_at(self) -> float:
        return self.built
