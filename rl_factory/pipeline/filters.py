"""Rollout filters: drop trajectories, or whole groups, that should not train, before advantages.

`rollout.filters` lists them by registry name or as `file.py:fn` / `package.module:fn`, optionally as a
mapping `{function, name, kwargs, level}` (the shape of `reward.functions`):

    rollout.filters: [truncated, tool_crashed, zero_variance]
    rollout.filters: [{function: my_filters.py:too_long, name: long, kwargs: {max_tokens: 200}}]

Built-ins (`FILTERS`; each logs `filter/<name>/dropped`, trajectories dropped this step):
- `truncated` (trajectory): stopped at the token budget (`stop_reason` in `reasons`, default max_tokens).
- `tool_crashed` (trajectory): a tool call failed through no fault of the model: the server crashed or
  timed out (`error_kind` in `kinds`, default crashed and timeout).
- `malformed` (trajectory): the model wrote a tool call that could not be parsed.
- `duplicate` (group): a trajectory whose token stream equals an earlier one of its group.
- `zero_variance` (group): every trajectory of a group whose estimator inputs are all equal (the
  rewards, or the tournament scores for `arena`): GRPO-style advantages are then all 0 (DAPO).

A user filter gets the keyword arguments it names and returns True to keep, False to drop. At level
`trajectory` (the default) those are a reward's arguments (`completion`, `tool_calls`, `stop_reason`,
dataset columns, ...; README "Rewards") plus `reward`, `reward_info` and `trajectory`. At level `group`
they are `trajectories`, `rewards`, `sample`, `prompt`, `answer` and the dataset columns, and it returns
one bool for the group or one per trajectory. A filter that raises stops the run naming the sample.

Order: the filters run in the order listed, each on what the previous ones kept, except `zero_variance`,
which always runs last, on the survivors' estimator inputs: a group [1, 1, 0] whose 0 is dropped as
truncated leaves [1, 1], which trains nothing. For `arena` it runs after the tournament, which is played
among the survivors only. How each estimator stays consistent when a trajectory is dropped: README
"Rollout pipeline" and `rl_factory/pipeline/__init__.py`.
"""
from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from rl_factory.config import ConfigError
from rl_factory.pipeline.entries import (PipelineError, call_user, check_options, check_unique, describe, is_bool,
                                         is_spec, load_user, parse_entry)
from rl_factory.base.registry import Registry
from rl_factory.base.types import Group, Trajectory
from rewards.loader import RewardFn, reward_kwargs

LEVELS = ("trajectory", "group")
ENTRY_KEYS = ("function", "name", "kwargs", "level")
# Filters that look at the estimator's inputs, so they run after every other filter (and after the
# tournament for arena). Only built-ins can be such filters.
SCORED = ("zero_variance",)


@dataclass(frozen=True)
class FilterDef:
    """A registered filter: `fn(traj, **kw) -> bool` (trajectory) or `fn(trajs, values, **kw) -> [bool]` (group)."""

    fn: Callable[..., Any]
    level: str


FILTERS: Registry[FilterDef] = Registry("rollout filter")


def register_filter(name: str, level: str = "trajectory") -> Callable[[Callable], Callable]:
    """Decorator adding a built-in filter under `name`; `level` is "trajectory" or "group"."""
    if level not in LEVELS:
        raise ValueError(f"filter {name!r}: level must be one of {list(LEVELS)}, got {level!r}")

    def decorator(fn: Callable) -> Callable:
        FILTERS.register(name)(FilterDef(fn, level))
        return fn
    return decorator


@register_filter("truncated")
def truncated(traj: Trajectory, reasons: Sequence[str] = ("max_tokens",)) -> bool:
    return traj.stop_reason not in reasons


@register_filter("tool_crashed")
def tool_crashed(traj: Trajectory, kinds: Sequence[str] = ("crashed", "timeout")) -> bool:
    return not any(r.error_kind in kinds for r in traj.tool_results)


@register_filter("malformed")
def malformed(traj: Trajectory) -> bool:
    # `error` is set on every call the parser could not read, executed or not (a last turn's call is not)
    return not any(c.error is not None for c in traj.tool_calls)


@register_filter("duplicate", level="group")
def duplicate(trajs: list[Trajectory], values: list[float] | None) -> list[bool]:
    seen: set[tuple[int, ...]] = set()
    keep = []
    for traj in trajs:
        ids = tuple(traj.token_ids)
        keep.append(ids not in seen)
        seen.add(ids)
    return keep


@register_filter("zero_variance", level="group")
def zero_variance(trajs: list[Trajectory], values: list[float], atol: float = 1e-8) -> list[bool]:
    informative = len(values) > 1 and max(values) - min(values) > atol
    return [informative] * len(trajs)


@dataclass
class Filter:
    """One entry of `rollout.filters`, ready to run."""

    name: str
    level: str
    where: str  # "rollout.filters[i]", for errors
    builtin: FilterDef | None = None
    user: RewardFn | None = None
    kwargs: dict[str, Any] = field(default_factory=dict)

    @property
    def scored(self) -> bool:
        """Whether it reads the estimator's inputs (then it runs last, on the survivors)."""
        return self.builtin is not None and self.name in SCORED

    async def keep(self, group: Group, values: list[float] | None = None) -> list[bool]:
        """One decision per trajectory of `group` (`values`: the estimator inputs, for scored filters)."""
        trajs = group.trajectories
        if self.builtin is not None:
            if self.level == "trajectory":
                return [bool(self.builtin.fn(t, **self.kwargs)) for t in trajs]
            return [bool(k) for k in self.builtin.fn(trajs, values, **self.kwargs)]
        if self.level == "trajectory":
            return [await self._keep_one(t) for t in trajs]
        where = describe(self.where, self.user, trajs[0], group=True)
        result = await call_user(self.user, _group_args(trajs), where)
        if is_bool(result):
            return [bool(result)] * len(trajs)
        if isinstance(result, (list, tuple)) and len(result) == len(trajs) and all(map(is_bool, result)):
            return [bool(k) for k in result]
        raise PipelineError(f"{where} returned {result!r:.60}; a group filter returns one bool for the group "
                            f"or a list of {len(trajs)} bools, one per trajectory")

    async def _keep_one(self, traj: Trajectory) -> bool:
        where = describe(self.where, self.user, traj)
        available = {**reward_kwargs(traj), "reward": traj.reward, "reward_info": traj.reward_info,
                     "trajectory": traj}
        result = await call_user(self.user, available, where)
        if not is_bool(result):
            raise PipelineError(f"{where} returned {type(result).__name__} {result!r:.60}; a filter returns "
                                "True (keep) or False (drop)")
        return bool(result)


def _group_args(trajs: list[Trajectory]) -> dict[str, Any]:
    first = reward_kwargs(trajs[0])
    columns = dict(trajs[0].sample or {})
    return {**columns, "trajectories": trajs, "rewards": [t.reward for t in trajs], "sample": first["sample"],
            "prompt": first["prompt"], "answer": first["answer"]}


def build_filters(entries: Sequence[Any] | None, where: str = "rollout.filters") -> list[Filter]:
    """The configured filters, checked: unknown names list the valid ones; user files are imported.

    Raises:
        ConfigError: a malformed entry, an unknown name, a spec that does not load, bad kwargs.
    """
    filters = [_build_one(entry, f"{where}[{i}]") for i, entry in enumerate(entries or [])]
    check_unique([f.name for f in filters], where, "filter")
    return filters


def _build_one(entry: Any, where: str) -> Filter:
    entry = parse_entry(entry, where, ENTRY_KEYS, "a filter")
    spec, name, kwargs, level = entry["function"], entry["name"], entry["kwargs"], entry.get("level")
    if is_spec(spec):
        level = level or "trajectory"
        if level not in LEVELS:
            raise ConfigError(f"{where}.level must be one of {list(LEVELS)}, got {level!r}")
        return Filter(name, level, where, user=load_user(spec, kwargs, where, "filter"))
    try:
        builtin = FILTERS.lookup(spec)
    except KeyError as exc:
        raise ConfigError(f"{where}: {exc.args[0]} (or a user filter as 'file.py:fn')") from None
    if level not in (None, builtin.level):
        raise ConfigError(f"{where}: {spec} is a {builtin.level}-level filter (drop `level`)")
    check_options(builtin.fn, kwargs, where, skip=2 if builtin.level == "group" else 1)
    return Filter(name, builtin.level, where, builtin=builtin, kwargs=kwargs)


ValuesFn = Callable[[list[Group]], Awaitable[tuple[list[float], dict[str, float]]]]


async def apply_filters(filters: list[Filter], groups: list[Group], estimator_inputs: ValuesFn,
                        dropped: dict[str, int]) -> tuple[list[Group], list[float], dict[str, float]]:
    """Run `filters` over `groups`: the unscored ones in order, then the estimator's inputs, then the scored.

    Args:
        filters: from `build_filters` (scored ones may come anywhere: they run last).
        groups: scored groups; their trajectories get `dropped_by` when a filter drops them.
        estimator_inputs: async (surviving groups) -> ([one value per survivor], metrics): the rewards,
            or for arena the tournament among the survivors.
        dropped: filter name -> trajectories dropped, added to.

    Returns:
        (groups that kept a trajectory, holding only their survivors; the survivors' values; the metrics
        of `estimator_inputs`).
    """
    for f in (f for f in filters if not f.scored):
        groups, _ = await _apply(f, groups, None, dropped)
    values, metrics = await estimator_inputs(groups)
    for f in (f for f in filters if f.scored):
        groups, values = await _apply(f, groups, values, dropped)
    return groups, values, metrics


async def _apply(f: Filter, groups: list[Group], values: list[float] | None, dropped: dict[str, int]
                 ) -> tuple[list[Group], list[float] | None]:
    """Run one filter over every group: survivors (empty groups removed), their values; marks the dropped."""
    out_groups, out_values, pos = [], [], 0
    for group in groups:
        n = len(group.trajectories)
        own = values[pos:pos + n] if values is not None else None
        pos += n
        keep = await f.keep(group, own)
        for traj, k in zip(group.trajectories, keep, strict=True):
            if not k:
                traj.dropped_by = f.name
        dropped[f.name] += keep.count(False)
        survivors = [t for t, k in zip(group.trajectories, keep) if k]
        if survivors:
            out_groups.append(Group(group.sample_index, survivors))
            if own is not None:
                out_values += [v for v, k in zip(own, keep) if k]
    return out_groups, out_values if values is not None else None
