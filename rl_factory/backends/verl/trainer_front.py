"""One class put in front of the trainer verl's registry holds for a mode (`trainer.v1.trainer_mode`).

verl's TaskRunner looks its trainer class up in `trainer_base.TRAINER_REGISTRY` by the mode's name, and its trainer
branches on that name, so ours never adds a mode: each of our trainer classes (start-up marks, the narrowed fetch,
the guard's batch read, the cache-keeping actor) goes in front of the class registered under the mode, in this
process (the TaskRunner's; runner.py).
"""
from __future__ import annotations

from typing import Any


def put_in_front(trainer_mode: str, mixin: type, name: str | None = None, attrs: dict[str, Any] | None = None) -> type:
    """`mixin` (with `attrs` on the new class) in front of the trainer registered as `trainer_mode`; idempotent:
    a registered class that already has it stays. Returns the class now registered."""
    from verl.trainer.ppo.v1 import trainer_base

    base = trainer_base.get_trainer_cls(trainer_mode)
    if issubclass(base, mixin):
        return base
    cls = type(f"{name or mixin.__name__}{base.__name__}", (mixin, base),
               {"__module__": mixin.__module__, **(attrs or {})})
    trainer_base.TRAINER_REGISTRY[trainer_mode] = cls
    return cls
