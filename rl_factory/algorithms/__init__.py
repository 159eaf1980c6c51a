"""Learning algorithms as registries: advantage estimators and policy losses.

Importing this package fills `ADVANTAGES` and `POLICY_LOSSES` with the built-ins; a module
that registers more (e.g. the arena estimator) must be imported before its name is looked up.
"""
from rl_factory.algorithms.advantages import (
    ADVANTAGES,
    assign_advantages,
    compute_advantages,
    get_advantage,
    register_advantage,
)
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
    "aggregate_loss",
    "assign_advantages",
    "compute_advantages",
    "get_advantage",
    "get_policy_loss",
    "kl_penalty",
    "register_advantage",
    "register_policy_loss",
]
