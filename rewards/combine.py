"""The run's reward, built from the `reward:` config: one function, or several with weights.

    reward:
      function: null
      functions:
        - {function: rewards.rules:numeric_match, weight: 1.0, name: correct}
        - {function: rewards.rules:tags_present, weight: 0.1, name: format, kwargs: {tags: [answer]}}

A trajectory's reward is the weighted sum of its components. Each component's own (unweighted)
score is kept in `traj.reward_info[<name>]` (its dict extras as `<name>/<key>`) and logged as
`reward/<name>/mean`. `kwargs` are arguments fixed in the config (a budget, a tag list, a tool
name); they win over the trajectory's arguments. The components of one trajectory run
concurrently. `reward.function` stays the way to name a single function (its dict extras are then
kept in `reward_info` unprefixed, as before); setting both is an error, and leaving both unset
means `DEFAULT_FUNCTION`, the calculator task's reward.

A component that raises, returns a non-score or runs past `timeout_s` stops the run with a
`RewardError` naming the sample (index and `id` column), the exception and the reward's inputs,
truncated to one line. With `on_error: zero` it scores 0 instead, its error text is kept in
`reward_info` (`reward_error`, or `<name>/reward_error`) and the scorer counts it in `reward/errors`.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rewards.executors import get_executor
from rewards.loader import RewardError, RewardFn, RewardLoadError, load_reward, prompt_text, reward_kwargs
from rewards.process import ProcessRewardConfig

if TYPE_CHECKING:
    from rl_factory.types import Trajectory

DEFAULT_FUNCTION = "rewards/exact_match.py:numeric_exact_match"
ON_ERROR = ("raise", "zero")
COMPONENT_KEYS = ("function", "weight", "name", "kwargs")
# Inputs shown in an error line, most telling first; the rest only if there is room.
SHOWN_INPUTS = ("completion", "answer")
MAX_INPUTS_CHARS = 160


@dataclass
class RewardConfig:
    """`reward.*`: which functions score a trajectory, and how they are run."""

    function: str | None = None
    functions: list[dict[str, Any]] | None = None
    success_threshold: float = 1.0
    max_concurrency: int = 64
    on_error: str = "raise"
    executor: str = "inline"
    timeout_s: float | None = None
    process: ProcessRewardConfig = field(default_factory=ProcessRewardConfig)


@dataclass
class Component:
    """One weighted reward function of the run's reward."""

    name: str
    fn: RewardFn
    weight: float = 1.0


class Reward:
    """Weighted reward functions plus how they run and what a failure does.

    Args:
        components: the functions; their names must be unique.
        on_error: "raise" (stop, naming the sample) or "zero" (score 0, counted).
        executor: where sync functions run: "inline", "thread" or "process" (rewards.executors).
        timeout_s: a call running longer is an error; None waits forever.
        named: keep and log each component under its name (`reward.functions`); False for the
            single `reward.function`, whose reward_info keeps the function's own keys.
        max_workers: processes of the "process" executor.
    """

    def __init__(self, components: list[Component], on_error: str = "raise", executor: str = "inline",
                 timeout_s: float | None = None, named: bool = True, max_workers: int = 4):
        if on_error not in ON_ERROR:
            raise RewardLoadError(f"reward.on_error: unknown value {on_error!r} (valid: {', '.join(ON_ERROR)})")
        names = [c.name for c in components]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise RewardLoadError(f"reward.functions: name {duplicates[0]!r} is used twice; "
                                  "give each entry its own `name`")
        self.components, self.on_error, self.timeout_s, self.named = components, on_error, timeout_s, named
        self.executor = get_executor(executor, max_workers=max_workers)
        for c in components:
            self.executor.check(c.fn)
        self.name = " + ".join(f"{c.weight:g}*{c.name}" for c in components) if named else components[0].fn.name

    @classmethod
    def wrap(cls, fn: Reward | RewardFn | Any) -> Reward:
        """A `Reward` as is; a `RewardFn` or plain callable as a single unnamed component."""
        if isinstance(fn, Reward):
            return fn
        fn = fn if isinstance(fn, RewardFn) else RewardFn(fn)
        return cls([Component(fn.name, fn)], named=False, executor="thread" if fn.run_in_thread else "inline")

    async def score(self, traj: Trajectory, tools: Any = None) -> tuple[float, dict[str, Any]]:
        """(reward, reward_info) of one trajectory: the weighted sum of its components' scores.

        Raises:
            RewardError: a component failed and `on_error` is "raise"; names the sample.
        """
        available = reward_kwargs(traj, tools)
        parts = await asyncio.gather(*(self._component(c, available, traj) for c in self.components))
        total, info = 0.0, {}
        for c, (value, extras) in zip(self.components, parts, strict=True):
            total += c.weight * value
            if self.named:
                info[c.name] = value
                info.update({f"{c.name}/{k}": v for k, v in extras.items()})
            else:
                info.update(extras)
        return total, info

    async def _component(self, c: Component, available: dict[str, Any],
                         traj: Trajectory) -> tuple[float, dict[str, Any]]:
        kwargs: dict[str, Any] = {}
        try:
            kwargs = c.fn.select_kwargs(available)
            return c.fn.to_score(await self.executor.run(c.fn, kwargs, self.timeout_s))
        except Exception as exc:
            if self.on_error == "raise":
                raise RewardError(describe_failure(c.fn.name, traj, kwargs, exc)) from exc
            return 0.0, {"reward_error": f"{type(exc).__name__}: {exc}"[:200]}

    async def __call__(self, **available: Any) -> float:
        """The weighted score from ready-made arguments (what pairwise reward judges call)."""
        total = 0.0
        for c in self.components:
            value = await self.executor.run(c.fn, c.fn.select_kwargs(available), self.timeout_s)
            total += c.weight * c.fn.to_score(value)[0]
        return total

    def close(self) -> None:
        """Stop worker processes, if any."""
        self.executor.close()


def build_reward(cfg: RewardConfig) -> Reward:
    """The run's `Reward` from its config slice.

    Raises:
        RewardLoadError: both or a malformed `functions` entry, a spec that does not load, an
            unknown `on_error` / `executor`, or a function the executor cannot run.
    """
    if cfg.function and cfg.functions:
        raise RewardLoadError("reward.function and reward.functions are both set; use reward.function for "
                              "one function, or reward.functions (with reward.function=null) for several")
    common = dict(on_error=cfg.on_error, executor=cfg.executor, timeout_s=cfg.timeout_s,
                  max_workers=max(1, cfg.max_concurrency))
    if not cfg.functions:
        fn = load_reward(cfg.function or DEFAULT_FUNCTION)
        return Reward([Component(fn.name, fn)], named=False, **common)
    return Reward([_component(entry, i) for i, entry in enumerate(cfg.functions)], **common)


def _component(entry: Any, index: int) -> Component:
    where = f"reward.functions[{index}]"
    if isinstance(entry, str):  # a bare spec: weight 1
        entry = {"function": entry}
    if not isinstance(entry, dict) or not entry.get("function"):
        raise RewardLoadError(f"{where} must be a mapping with a `function` "
                              f"(and optional weight, name, kwargs), got {entry!r:.80}")
    unknown = sorted(set(entry) - set(COMPONENT_KEYS))
    if unknown:
        raise RewardLoadError(f"{where}: unknown key {unknown[0]!r} (valid: {', '.join(COMPONENT_KEYS)})")
    weight = entry.get("weight", 1.0)
    if isinstance(weight, bool) or not isinstance(weight, (int, float)):
        raise RewardLoadError(f"{where}.weight must be a number, got {weight!r}")
    kwargs = entry.get("kwargs") or {}
    if not isinstance(kwargs, dict):
        raise RewardLoadError(f"{where}.kwargs must be a mapping, got {kwargs!r:.80}")
    try:
        fn = load_reward(entry["function"], bound=kwargs)
    except RewardLoadError as exc:
        raise RewardLoadError(f"{where}: {exc}") from exc.__cause__
    name = str(entry.get("name") or str(entry["function"]).rpartition(":")[2])
    return Component(name, fn, float(weight))


def describe_failure(name: str, traj: Trajectory, kwargs: dict[str, Any], exc: BaseException) -> str:
    """One line: which reward failed on which sample, with what, given which inputs (truncated)."""
    sample = traj.sample or {}
    ident = f" (id {sample['id']!r:.40})" if sample.get("id") is not None else ""
    return (f"reward {name} failed on sample {traj.sample_index}{ident} "
            f"(prompt: {prompt_text(traj)[:80]!r}): {type(exc).__name__}: {str(exc)[:120]}; "
            f"inputs: {_inputs(kwargs)}")


def _inputs(kwargs: dict[str, Any]) -> str:
    keys = [k for k in SHOWN_INPUTS if k in kwargs] + sorted(
        k for k in kwargs if k not in SHOWN_INPUTS and k not in ("tools", "sample", "messages", "turns"))
    text = ", ".join(f"{k}={_short(kwargs[k])}" for k in keys) or "none"
    return text if len(text) <= MAX_INPUTS_CHARS else text[:MAX_INPUTS_CHARS - 3] + "..."


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."
