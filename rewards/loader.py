"""Load the user's reward function from a spec string and call it the way verifiers does.

A reward is a plain function, sync or async, that names the keyword arguments it wants:

    def reward(completion: str, answer: str, tool_calls: list, **_) -> float: ...

`load_reward("my_reward.py:reward")` (a file path, relative to the cwd or absolute) or
`load_reward("my_pkg.rewards:reward")` (an importable module) returns a `RewardFn` that passes
only the arguments the function names (everything if it takes `**kwargs`), chosen from
`REWARD_ARGS` plus every column of the dataset row under its own name. Where a column and a
standard argument share a name (`prompt`, `messages`, `answer`), the standard argument wins.

A reward returns a float, a dict with a "score" key (the other keys become per-trajectory
metrics in `reward_info`), or None, which scores 0 and is counted (TRL's "n/a" reward), so a
reward that abstains is visible in the metrics instead of silently looking like a wrong answer.
"""
from __future__ import annotations

import asyncio
import hashlib
import importlib
import importlib.util
import inspect
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rl_factory.types import Trajectory

REWARD_ARGS = (
    "completion", "answer", "prompt", "messages", "tool_calls", "tool_results",
    "sample", "num_turns", "stop_reason",
)


class RewardLoadError(ValueError):
    """The reward spec cannot be turned into a function (bad spec, file, import or name)."""


class RewardError(RuntimeError):
    """The reward function raised or returned something that is not a score."""


class RewardFn:
    """A user reward function plus the knowledge of which keyword arguments it takes.

    Args:
        fn: the user's callable, sync or async.
        name: shown in error messages; defaults to the function's qualified name.
        run_in_thread: run a sync function via `asyncio.to_thread` so a slow reward (a
            subprocess, a sandbox) does not block the event loop. Async functions ignore it.
    """

    def __init__(self, fn: Callable[..., Any], name: str | None = None,
                 run_in_thread: bool = False):
        self.fn = fn
        self.name = name or getattr(fn, "__qualname__", repr(fn))
        self.run_in_thread = run_in_thread
        self.num_none = 0  # how many calls returned None, over the life of this object
        params = inspect.signature(fn).parameters.values()
        self.takes_any = any(p.kind is p.VAR_KEYWORD for p in params)
        named = [p for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
        self.arg_names = [p.name for p in named]
        self.required = [p.name for p in named if p.default is p.empty]
        positional_only = [p.name for p in params if p.kind is p.POSITIONAL_ONLY]
        if positional_only:
            raise RewardLoadError(f"reward function {self.name} has positional-only parameters "
                                  f"{positional_only}; rewards are called with keyword arguments")

    def select_kwargs(self, available: dict[str, Any]) -> dict[str, Any]:
        """Pick from `available` the arguments the function names (all of them for **kwargs)."""
        missing = [n for n in self.required if n not in available]
        if missing:
            raise RewardError(
                f"reward function {self.name} needs {missing}, which is neither a standard "
                f"reward argument {list(REWARD_ARGS)} nor a dataset column "
                f"(columns: {_columns(available)})")
        if self.takes_any:
            return dict(available)
        return {n: available[n] for n in self.arg_names if n in available}

    async def __call__(self, **available: Any) -> Any:
        """Call the function with the arguments it names; returns its raw result."""
        kwargs = self.select_kwargs(available)
        if self.run_in_thread and not inspect.iscoroutinefunction(self.fn):
            result = await asyncio.to_thread(self.fn, **kwargs)
        else:
            result = self.fn(**kwargs)
        if inspect.isawaitable(result):
            result = await result
        return result

    async def score(self, traj: Trajectory) -> tuple[float, dict[str, Any]]:
        """Score one trajectory: (reward, reward_info). Lets the function's exceptions through."""
        value = await self(**reward_kwargs(traj))
        if value is None:
            self.num_none += 1
            return 0.0, {"reward_none": 1.0}
        return normalize_reward(value)


def load_reward(spec: str | Callable[..., Any], run_in_thread: bool = False) -> RewardFn:
    """Resolve `path/to/file.py:fn` or `package.module:fn` to a `RewardFn`.

    Args:
        spec: the spec string; a callable is wrapped as is.
        run_in_thread: see `RewardFn`.

    Returns:
        The wrapped function.

    Raises:
        RewardLoadError: malformed spec, missing file, failing import, or no such function.
    """
    if callable(spec):
        return RewardFn(spec, run_in_thread=run_in_thread)
    target, sep, fn_name = str(spec).rpartition(":")
    if not sep or not target or not fn_name:
        raise RewardLoadError(f"reward spec {spec!r} must look like 'path/to/file.py:function' "
                              "or 'package.module:function'")
    is_file = target.endswith(".py") or "/" in target or "\\" in target
    module = _import_file(target) if is_file else _import_module(target)
    fn = getattr(module, fn_name, None)
    if fn is None or not callable(fn):
        found = sorted(n for n, v in vars(module).items()
                       if callable(v) and not n.startswith("_") and not inspect.ismodule(v))
        what = "is not callable" if fn is not None else "not found"
        raise RewardLoadError(f"reward function {fn_name!r} {what} in {target}; "
                              f"callables there: {found or 'none'}")
    return RewardFn(fn, name=f"{target}:{fn_name}", run_in_thread=run_in_thread)


def _import_file(target: str):
    path = Path(target).expanduser()
    if not path.is_file():
        raise RewardLoadError(f"reward file not found: {target} (looked at {path.resolve()})")
    path = path.resolve()
    # A unique module name keeps two reward files called reward.py apart; registering it in
    # sys.modules before exec lets dataclasses and pickling inside the file find their module.
    digest = hashlib.sha1(str(path).encode()).hexdigest()[:10]
    mod_name = f"_rl_factory_reward_{path.stem}_{digest}"
    if mod_name in sys.modules:
        return sys.modules[mod_name]
    # Like `python file.py`: sibling helper modules of the reward file are importable.
    if str(path.parent) not in sys.path:
        sys.path.insert(0, str(path.parent))
    mod_spec = importlib.util.spec_from_file_location(mod_name, path)
    module = importlib.util.module_from_spec(mod_spec)
    sys.modules[mod_name] = module
    try:
        mod_spec.loader.exec_module(module)
    except (Exception, SystemExit) as exc:
        del sys.modules[mod_name]
        raise RewardLoadError(f"importing reward file {target} failed: "
                              f"{type(exc).__name__}: {exc}") from exc
    return module


def _import_module(target: str):
    try:
        return importlib.import_module(target)
    except ModuleNotFoundError as exc:
        if exc.name and (target == exc.name or target.startswith(exc.name + ".")):
            raise RewardLoadError(f"reward module {target!r} not found (is it on PYTHONPATH? "
                                  "for a file, write path/to/file.py:function)") from exc
        raise RewardLoadError(f"importing reward module {target} failed: {exc}") from exc
    except (Exception, SystemExit) as exc:
        raise RewardLoadError(f"importing reward module {target} failed: "
                              f"{type(exc).__name__}: {exc}") from exc


def reward_kwargs(traj: Trajectory) -> dict[str, Any]:
    """Every argument a reward function may name, for one trajectory."""
    sample = traj.sample or {}
    available = {k: v for k, v in sample.items() if k not in REWARD_ARGS}
    available.update(
        completion=traj.completion,
        answer=sample.get("answer"),
        prompt=prompt_text(traj),
        messages=traj.messages,
        tool_calls=[{"name": c.name, "arguments": c.arguments} for c in traj.tool_calls],
        tool_results=[{"name": r.call.name, "text": r.text, "ok": r.ok, "error_kind": r.error_kind}
                      for r in traj.tool_results],
        sample=sample,
        num_turns=len(traj.turns),
        stop_reason=traj.stop_reason,
    )
    return available


def prompt_text(traj: Trajectory) -> str:
    """The prompt as a string: the raw string prompt, else the last user message of the row."""
    sample = traj.sample or {}
    if isinstance(sample.get("prompt"), str):
        return sample["prompt"]
    messages = sample.get("messages") or traj.messages
    users = [m for m in messages if m.get("role") == "user"]
    if not users:
        return ""
    content = (users[-1] if sample.get("messages") else users[0]).get("content")
    if isinstance(content, list):  # multimodal parts: keep the text ones
        return " ".join(p.get("text", "") for p in content if isinstance(p, dict))
    return "" if content is None else str(content)


def normalize_reward(value: Any) -> tuple[float, dict[str, Any]]:
    """Turn a float or a {"score": ..., **metrics} dict into (reward, reward_info)."""
    info: dict[str, Any] = {}
    if isinstance(value, dict):
        if "score" not in value:
            raise RewardError("reward returned a dict without a 'score' key "
                              f"(keys: {sorted(value)})")
        info = {k: v for k, v in value.items() if k != "score"}
        value = value["score"]
    try:
        score = float(value)
    except (TypeError, ValueError) as exc:
        raise RewardError(f"reward returned {type(value).__name__} {value!r:.80}; "
                          "expected a float, a dict with 'score', or None") from exc
    if not math.isfinite(score):
        raise RewardError(f"reward returned a non-finite score {score}")
    return score, info


async def score_trajectories(reward_fn: RewardFn | Callable[..., Any], trajs: list[Trajectory],
                             max_concurrency: int = 64) -> dict[str, float]:
    """Set `traj.reward` and `traj.reward_info` of every trajectory, `max_concurrency` at a time.

    Args:
        reward_fn: from `load_reward` (a plain function is wrapped in a `RewardFn`).
        trajs: the trajectories to score, modified in place.
        max_concurrency: bound on concurrently running (async or threaded) reward calls.

    Returns:
        Batch metrics: `reward/none_count`, how many calls returned None.

    Raises:
        RewardError: naming the first failing trajectory (in list order) by sample index and
            prompt, chained to the user function's exception.
    """
    if not isinstance(reward_fn, RewardFn):
        reward_fn = RewardFn(reward_fn)
    semaphore = asyncio.Semaphore(max_concurrency)

    async def score_one(traj: Trajectory) -> tuple[float, dict[str, Any]]:
        async with semaphore:
            return await reward_fn.score(traj)

    # return_exceptions: all calls finish, then the first failure in list order is reported,
    # so the error names the same sample on every run.
    results = await asyncio.gather(*(score_one(t) for t in trajs), return_exceptions=True)
    for traj, result in zip(trajs, results, strict=True):
        if isinstance(result, BaseException):
            raise RewardError(
                f"reward function {reward_fn.name} failed on sample {traj.sample_index} "
                f"(prompt: {prompt_text(traj)[:80]!r}): {type(result).__name__}: {result}"
            ) from result
    none_count = 0
    for traj, (reward, info) in zip(trajs, results, strict=True):
        traj.reward, traj.reward_info = reward, info
        none_count += int("reward_none" in info)
    return {"reward/none_count": float(none_count)}


def _columns(available: dict[str, Any]) -> list[str]:
    return sorted(k for k in available if k not in REWARD_ARGS)
