"""An environment that speaks: `env.environment: file.py:Name` (or `pkg.module:Name`), one instance per episode.

    class Guess:
        def __init__(self, low: int = 1, high: int = 100): ...          # env.environment_kwargs
        async def reset(self, sample) -> list[dict]:                    # messages after the prompt
            self.state = {"target": sample["target"], "solved": False}
            return []
        async def step(self, trajectory) -> tuple[list[dict], bool]:     # after every assistant turn
            guess = parse(trajectory.turns[-1].text)
            if guess == self.state["target"]:
                self.state["solved"] = True
                return [], True                                         # done: stop_reason "env_done"
            return [{"role": "user", "content": "higher" if guess < self.state["target"] else "lower"}], False
        async def close(self): ...

`reset(sample)` runs before the first generation; its messages (any role) are appended to the dataset
prompt, so they are part of the prompt the policy reads. `step(trajectory)` runs after each assistant
turn, once that turn's tool results are appended (if it made calls), with the trajectory so far (a
`Trajectory`: `.messages`, `.turns`, `.sample`, ...). The messages it returns (role `user` or `tool`)
are appended as an observation, mask 0, through the chat template's delta, exactly like tool results
(rl_factory.rollout); `True` ends the episode. `close()` runs when the episode closes, also when it
failed. An optional `state` attribute (a dict) is what the reward receives as `state`.

The class is checked when the run starts (each hook present and `async def`), so a typo fails once,
before any server starts; an exception a hook raises for one sample fails that sample's episode only.
"""
from __future__ import annotations

import importlib
import inspect
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rl_factory.base.imports import import_file

HOOKS = ("reset", "step", "close")


class EnvironmentLoadError(ValueError):
    """`env.environment` does not name a usable class (the message names the spec and the hook)."""


class EnvironmentFactory:
    """Makes one environment instance per episode from the class and `env.environment_kwargs`."""

    def __init__(self, cls: type, kwargs: Mapping[str, Any] | None, spec: str):
        self.cls, self.kwargs, self.spec = cls, dict(kwargs or {}), spec

    def __call__(self) -> Any:
        return self.cls(**self.kwargs)


def load_environment(spec: str | type | None, kwargs: Mapping[str, Any] | None = None,
                     base_dir: Path | None = None) -> EnvironmentFactory | None:
    """The factory for `env.environment` (None: no environment), its hooks checked.

    Raises:
        EnvironmentLoadError: a malformed spec, a file or module that does not import, no such class,
            a hook missing or not `async def`, or constructor arguments it does not take.
    """
    if spec is None or spec == "":
        return None
    if isinstance(spec, type):
        cls, label = spec, spec.__qualname__
    else:
        cls, label = _import(str(spec), base_dir), str(spec)
    problems = [f"{h} is missing" if not hasattr(cls, h) else f"{h} is not `async def`"
                for h in HOOKS if not inspect.iscoroutinefunction(getattr(cls, h, None))]
    if problems:
        raise EnvironmentLoadError(f"env.environment={label}: {'; '.join(problems)} (an environment has "
                                   "async reset(sample) -> messages, async step(trajectory) -> (messages, done) "
                                   "and async close())")
    try:
        inspect.signature(cls).bind(**dict(kwargs or {}))
    except TypeError as exc:
        raise EnvironmentLoadError(f"env.environment_kwargs do not fit {label}: {exc}") from None
    return EnvironmentFactory(cls, kwargs, label)


def _import(spec: str, base_dir: Path | None) -> type:
    target, sep, name = spec.rpartition(":")
    if not sep or not target or not name.isidentifier():
        raise EnvironmentLoadError(f"env.environment={spec!r}: expected 'path/to/file.py:ClassName' or "
                                   "'package.module:ClassName'")
    is_file = target.endswith(".py") or "/" in target
    try:
        if is_file:
            path = Path(target).expanduser()
            if not path.is_absolute() and base_dir is not None and (base_dir / path).is_file():
                path = base_dir / path
            if not path.is_file():
                looked = [base_dir / target] if base_dir is not None and not Path(target).is_absolute() else []
                raise EnvironmentLoadError(f"env.environment: file not found: {target} (looked at "
                                           f"{', '.join(str(p.resolve()) for p in [*looked, path])})")
            if str(path.resolve().parent) not in sys.path:  # like `python file.py`: its helpers import
                sys.path.insert(0, str(path.resolve().parent))
            module = import_file(path, "_rl_factory_environment")
        else:
            module = importlib.import_module(target)
    except EnvironmentLoadError:
        raise
    except (Exception, SystemExit) as exc:
        raise EnvironmentLoadError(f"env.environment: importing {target} failed: {type(exc).__name__}: {exc}") from None
    cls = getattr(module, name, None)
    if not isinstance(cls, type):
        found = sorted(n for n, v in vars(module).items() if isinstance(v, type) and not n.startswith("_")
                       and getattr(v, "__module__", None) == module.__name__)
        raise EnvironmentLoadError(f"env.environment: no class {name!r} in {target} (classes there: "
                                   f"{', '.join(found) or 'none'})")
    return cls


def check_messages(messages: Any, where: str, roles: tuple[str, ...] | None = None) -> list[dict]:
    """An environment's messages, checked: a list of {"role", "content"} mappings (ValueError otherwise)."""
    if messages is None:
        return []
    if not isinstance(messages, list):
        raise ValueError(f"{where} returned {type(messages).__name__}; expected a list of messages")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping) or not isinstance(m.get("role"), str) or "content" not in m:
            raise ValueError(f"{where} message {i} is {m!r:.80}; expected {{'role': ..., 'content': ...}}")
        if roles is not None and m["role"] not in roles:
            raise ValueError(f"{where} message {i} has role {m['role']!r}; an environment answers as "
                             f"{' or '.join(roles)} (assistant tokens are the policy's own)")
        out.append(dict(m))
    return out

