"""The registry behind every pluggable name: estimators, losses, engines, parsers, judges, loggers, ...

A `Registry` is a plain dict (name -> object) that a decorator fills; a taken name is an error naming
who took it, and an unknown name is an error listing the valid ones. It lives apart from everything
else (it imports only `rl_factory.base.errors`) so that `envs` and `rewards` can use it without pulling in
the trainer.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

from rl_factory.base.errors import UnknownName

T = TypeVar("T")


class Registry(dict, Generic[T]):
    """name -> T, filled by `@registry.register(name)`; `kind` names the registry in errors."""

    def __init__(self, kind: str):
        super().__init__()
        self.kind = kind

    def register(self, name: str) -> Callable[[T], T]:
        def decorator(obj: T) -> T:
            if name in self:
                old = self[name]
                raise ValueError(f"{self.kind} {name!r} is already registered "
                                 f"(by {getattr(old, '__module__', '?')}.{getattr(old, '__qualname__', old)})")
            self[name] = obj
            return obj
        return decorator

    def lookup(self, name: str) -> T:
        """The object registered as `name`; `UnknownName` (a KeyError) listing the valid names otherwise."""
        if name not in self:
            raise UnknownName(f"unknown {self.kind} {name!r}; valid: {sorted(self)}")
        return self[name]
