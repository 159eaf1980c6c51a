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

How the components run and what a failure does is the scorer's (`rewards.scorer.Scorer`): a
component that raises, returns a non-score or runs past `timeout_s` stops the run with a
`RewardError` naming the sample (index and `id` column), the exception and the reward's inputs,
truncated to one line (`describe_failure`). With `on_error: zero` it scores 0 instead, its error
text is kept in `reward_info` (`reward_error`, or `<name>/reward_error`) and counted in `reward/errors`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rl_factory.base.secrets import redact_known
from rewards.loader import RewardFn, RewardLoadError, load_reward, prompt_text
from rewards.process import ProcessRewardConfig

if TYPE_CHECKING:
    from rl_factory.base.types import Trajectory

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
    max_abs: float | None = 1e6
    process: ProcessRewardConfig = field(default_factory=ProcessRewardConfig)


@dataclass
class Component:
    """One weighted reward function of the run's reward."""

    name: str
    fn: RewardFn
    weight: float = 1.0


def build_components(cfg: RewardConfig) -> tuple[list[Component], bool]:
    """The weighted functions of `reward.function` / `reward.functions`, and whether they are named
    (`reward.functions`: each logged under its name).

    Raises:
        RewardLoadError: both set, a malformed `functions` entry, or a spec that does not load.
    """
    if cfg.function and cfg.functions:
        raise RewardLoadError("reward.function and reward.functions are both set; use reward.function for "
                              "one function, or reward.functions (with reward.function=null) for several")
    if not cfg.functions:
        fn = load_reward(cfg.function or DEFAULT_FUNCTION)
        return [Component(fn.name, fn)], False
    return [_component(entry, i) for i, entry in enumerate(cfg.functions)], True


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
            f"(prompt: {prompt_text(traj)[:80]!r}): {type(exc).__name__}: {redact_known(str(exc))[:120]}; "
            f"inputs: {_inputs(kwargs)}")


def _inputs(kwargs: dict[str, Any]) -> str:
    keys = [k for k in SHOWN_INPUTS if k in kwargs] + sorted(
        k for k in kwargs if k not in SHOWN_INPUTS and k not in ("tools", "sample", "messages", "turns"))
    text = ", ".join(f"{k}={_short(kwargs[k])}" for k in keys) or "none"
    return text if len(text) <= MAX_INPUTS_CHARS else text[:MAX_INPUTS_CHARS - 3] + "..."


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."
