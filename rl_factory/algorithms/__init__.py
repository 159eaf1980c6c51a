"""Learning algorithms as registries: advantage estimators, policy losses and tournament topologies.

Importing this package fills `ADVANTAGES` and `POLICY_LOSSES` with the built-ins; tournament topologies
(`rl_factory.algorithms.arena.TOPOLOGIES`) are registered when `arena` is imported. A module that
registers more must be imported before its names are looked up.
"""
from rl_factory.algorithms.advantages import (
    ADVANTAGES,
    AdvantageInputs,
    assign_advantages,
    compute_advantages,
    estimate,
    get_advantage,
    register_advantage,
    required_inputs,
)
from rl_factory.algorithms import gae as _gae  # noqa: F401  (registers `gae`; it builds on advantages)
from rl_factory.algorithms.losses import (
    POLICY_LOSSES,
    aggregate_loss,
    get_policy_loss,
    kl_penalty,
    register_policy_loss,
)

__all__ = [
    "ADVANTAGES",
    "POLICY_LOSSES",
    "AdvantageInputs",
    "aggregate_loss",
    "assign_advantages",
    "compute_advantages",
    "estimate",
    "get_advantage",
    "get_policy_loss",
    "kl_penalty",
    "register_advantage",
    "register_policy_loss",
    "required_inputs",
]
