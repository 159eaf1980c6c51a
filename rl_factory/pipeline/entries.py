"""What filters and augmenters share: config entries, user functions and their errors.

An entry of `rollout.filters` / `rollout.augment` is a registry name, a `file.py:fn` / `package.module:fn`
spec, or a mapping `{function, name, kwargs, ...}` (the shape of `reward.functions`). User functions are
loaded and called like rewards (`rewards.loader`): they get the keyword arguments they name.
"""
from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from rl_factory.config import ConfigError
from rl_factory.base.errors import UserError
from rl_factory.base.types import Trajectory
from rewards.loader import RewardError, RewardFn, RewardLoadError, load_reward, prompt_text


class PipelineError(UserError, RuntimeError):
    """A user filter or augmenter raised, or returned something that is not what its stage expects."""


def parse_entry(entry: Any, where: str, keys: tuple[str, ...], kind: str) -> dict[str, Any]:
    """`entry` as a checked mapping with `function`, `name` and `kwargs` filled in.

    Raises:
        ConfigError: not a name, spec or mapping with `function`; an unknown key; kwargs not a mapping.
    """
    entry = {"function": entry} if isinstance(entry, str) else entry
    if not isinstance(entry, dict) or not entry.get("function"):
        others = ", ".join(k for k in keys if k != "function")
        raise ConfigError(f"{where} must be {kind} name, a 'file.py:fn' spec or a mapping with `function` "
                          f"(and optional {others}), got {entry!r:.80}")
    unknown = sorted(set(entry) - set(keys))
    if unknown:
        raise ConfigError(f"{where}: unknown key {unknown[0]!r} (valid: {', '.join(keys)})")
    kwargs = entry.get("kwargs") or {}
    if not isinstance(kwargs, dict):
        raise ConfigError(f"{where}.kwargs must be a mapping, got {kwargs!r:.80}")
    spec = str(entry["function"])
    return {**entry, "function": spec, "kwargs": dict(kwargs), "name": str(entry.get("name") or spec.rpartition(":")[2])}


def is_spec(function: str) -> bool:
    """A user function ("file.py:fn", "pkg.module:fn") rather than a registry name."""
    return ":" in function


def load_user(spec: str, kwargs: dict[str, Any], where: str, kind: str) -> RewardFn:
    """Load a user function with its fixed `kwargs`; errors say `where` and `kind` (filter, augmenter)."""
    try:
        return load_reward(spec, bound=kwargs)
    except RewardLoadError as exc:
        raise ConfigError(f"{where}: {str(exc).replace('reward ', kind + ' ', 1)}") from None


def check_options(fn: Callable, kwargs: dict[str, Any], where: str, skip: int) -> None:
    """Every key of `kwargs` must be an option of built-in `fn` (its parameters after the first `skip`)."""
    params = list(inspect.signature(fn).parameters)[skip:]
    bad = sorted(set(kwargs) - set(params))
    if bad:
        raise ConfigError(f"{where}.kwargs: {fn.__name__} has no option {bad[0]!r} (options: {params or 'none'})")


def check_unique(names: list[str], where: str, kind: str) -> None:
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ConfigError(f"{where}: {kind} name {twice[0]!r} is used twice; give each entry its own `name`")


async def call_user(fn: RewardFn, available: dict[str, Any], where: str) -> Any:
    """Call a user function; anything it raises becomes a `PipelineError` starting with `where`."""
    try:
        return await fn(**available)
    except (Exception, SystemExit) as exc:
        detail = exc.args[0] if isinstance(exc, RewardError) and exc.args else f"{type(exc).__name__}: {exc}"
        raise PipelineError(f"{where} failed: {str(detail)[:200]}") from exc


def describe(entry_where: str, fn: RewardFn, traj: Trajectory, group: bool = False) -> str:
    """'rollout.filters[1] (f.py:keep) on sample 3 (id 'q3') (prompt: ...)': who ran on what, for errors."""
    sample = traj.sample or {}
    ident = f" (id {sample['id']!r:.40})" if sample.get("id") is not None else ""
    what = "the group of sample" if group else "sample"
    return f"{entry_where} ({fn.name}) on {what} {traj.sample_index}{ident} (prompt: {prompt_text(traj)[:80]!r})"


def is_bool(value: Any) -> bool:
    return isinstance(value, bool) or type(value).__name__ == "bool_"  # numpy's bool too
