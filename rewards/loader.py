"""Load the user's reward function from a spec string and call it the way verifiers does.

A reward is a plain function, sync or async, that names the keyword arguments it wants:

    def reward(completion: str, answer: str, tool_calls: list, **_) -> float: ...

`load_reward("my_reward.py:reward")` (a file path, relative to the cwd or absolute) or
`load_reward("my_pkg.rewards:reward")` (an importable module) returns a `RewardFn` that passes
only the arguments the function names (everything if it takes `**kwargs`), chosen from
`REWARD_ARGS` plus every column of the dataset row under its own name. Where a column and a
standard argument share a name (`prompt`, `messages`, `answer`), the standard argument wins.
Arguments fixed in the config (`RewardFn(fn, bound={...})`) win over both.

`tools` is a `RewardTools` handle on the trajectory's own episode (envs.episode), still open when the
reward runs, so a reward can verify by tool (`await tools.call("query", {"sql": ...})` reads the rows
the agent changed in its own database). `state` is what the environment (`env.environment`) kept.

A function with verl's signature, `compute_score(data_source, solution_str, ground_truth, extra_info=None,
**kwargs)`, is recognised and called as verl calls it (rewards.verl_style).

A reward returns a float, a dict with a "score" key (the other keys become per-trajectory
metrics in `reward_info`), or None, which scores 0 and is counted (TRL's "n/a" reward), so a
reward that abstains is visible in the metrics instead of silently looking like a wrong answer.
"""
from __future__ import annotations

import asyncio
import importlib
import inspect
import json
import math
import numbers
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rl_factory.base.errors import UserError
from rl_factory.base.imports import import_file
from rl_factory.base.types import ToolCall, ToolResult
from rewards import verl_style

if TYPE_CHECKING:
    from rl_factory.base.types import Trajectory

REWARD_ARGS = (
    "completion", "answer", "prompt", "messages", "turns", "tool_calls", "tool_results",
    "sample", "num_turns", "stop_reason", "data_source", "extra_info", "tools", "state",
    # verl's names (rewards.verl_style): the final completion, the answer, and everything after the prompt
    "solution_str", "ground_truth", "transcript",
)


class RewardLoadError(UserError, ValueError):
    """The reward spec cannot be turned into a function (bad spec, file, import or name)."""


class RewardError(UserError, RuntimeError):
    """The reward function raised or returned something that is not a score."""


class RewardTools:
    """The `tools` argument: calls the run's tools (MCP servers and functions of the manifest).

        async def reward(completion, answer, tools, **_):
            result = await tools.call("run_sql", {"query": completion})
            return float(result.ok and result.text.strip() == answer)

    Calls get the agent's routing, schema checks, timeouts and caches, but stay out of the env's
    `tool/*` metrics, which describe the agent; `num_calls` counts them instead.

    Args:
        env: the live `envs.ToolEnv` (or anything with `async call(ToolCall, record=False) -> ToolResult`);
            None when the caller has none, and then every call raises `RewardError`.
    """

    def __init__(self, env: Any = None, counter: RewardTools | None = None):
        if isinstance(env, RewardTools):
            env = env.env
        self.env = env
        self.num_calls = 0
        self._counter = counter  # the scorer's own handle, which counts every reward call for its metrics

    @property
    def names(self) -> list[str]:
        """The tool names a call may use."""
        return list(self.env.tool_names) if self.env is not None else []

    async def call(self, name: str, arguments: dict[str, Any] | None = None) -> ToolResult:
        """Run one tool call; failures come back as a `ToolResult` with `ok` False, never raise.

        Returns:
            The result: `.text` (what the tool printed), `.ok`, `.error_kind`.
        """
        if self.env is None:
            raise RewardError(f"the reward called tool {name!r} but no tool env was given "
                              "(pass tools=env to score_trajectories)")
        arguments = dict(arguments or {})
        call = ToolCall(name=name, arguments=arguments, raw=json.dumps(arguments, default=str))
        self.num_calls += 1
        if self._counter is not None:
            self._counter.num_calls += 1
        return await self.env.call(call, record=False)  # tool/* metrics stay the agent's


class RewardFn:
    """A user reward function plus the knowledge of which keyword arguments it takes.

    Args:
        fn: the user's callable, sync or async.
        name: shown in error messages; defaults to the function's qualified name.
        run_in_thread: run a sync function via `asyncio.to_thread` so a slow reward (a
            subprocess, a sandbox) does not block the event loop. Async functions ignore it.
        bound: arguments fixed by the config (e.g. `{"max_tokens": 256}`); they win over the
            trajectory's arguments and dataset columns of the same name.
        spec: the spec it was loaded from, so a worker process can load it again.
    """

    def __init__(self, fn: Callable[..., Any], name: str | None = None,
                 run_in_thread: bool = False, bound: dict[str, Any] | None = None,
                 spec: str | None = None):
        self.fn = fn
        self.name = name or getattr(fn, "__qualname__", repr(fn))
        self.run_in_thread = run_in_thread
        self.bound = dict(bound or {})
        self.spec = spec
        self.num_none = 0  # how many calls returned None, over the life of this object
        params = inspect.signature(fn).parameters.values()
        self.takes_any = any(p.kind is p.VAR_KEYWORD for p in params)
        named = [p for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
        self.arg_names = [p.name for p in named]
        self.required = [p.name for p in named if p.default is p.empty and p.name not in self.bound]
        positional_only = [p.name for p in params if p.kind is p.POSITIONAL_ONLY]
        if positional_only:
            raise RewardLoadError(f"reward function {self.name} has positional-only parameters "
                                  f"{positional_only}; rewards are called with keyword arguments")
        unknown = [k for k in self.bound if k not in self.arg_names]
        if unknown and not self.takes_any:
            raise RewardLoadError(f"reward function {self.name} has no parameter {unknown[0]!r} "
                                  f"(its parameters: {self.arg_names})")
        try:
            self.verl = verl_style.recognise(fn, self.arg_names)  # None unless it has verl's signature
        except ValueError as exc:
            raise RewardLoadError(f"reward function {self.name}: {exc}") from None

    @property
    def is_async(self) -> bool:
        return inspect.iscoroutinefunction(self.fn) or inspect.iscoroutinefunction(
            getattr(self.fn, "__call__", None))

    def wants(self, arg: str) -> bool:
        """Whether a call passes `arg` (it is named, or the function takes **kwargs)."""
        return self.takes_any or arg in self.arg_names

    def select_kwargs(self, available: dict[str, Any]) -> dict[str, Any]:
        """Pick from `available` the arguments the function names (all of them for **kwargs)."""
        if self.verl is not None:
            available = self.verl.arguments(available)
        available = {**available, **self.bound}
        missing = [n for n in self.required if n not in available]
        if missing:
            raise RewardError(
                f"reward function {self.name} needs {missing}, which is neither a standard "
                f"reward argument {list(REWARD_ARGS)} nor a dataset column "
                f"(columns: {_columns(available)})")
        if self.takes_any and self.verl is None:
            return available
        names = [*self.arg_names, *verl_style.VERL_ARGS, *self.bound] if self.takes_any else self.arg_names
        return {n: available[n] for n in dict.fromkeys(names) if n in available}

    async def __call__(self, **available: Any) -> Any:
        """Call the function with the arguments it names; returns its raw result."""
        kwargs = self.select_kwargs(available)
        if self.run_in_thread and not self.is_async:
            result = await asyncio.to_thread(self.fn, **kwargs)
        else:
            result = self.fn(**kwargs)
        if inspect.isawaitable(result):
            result = await result
        return result

    def to_score(self, value: Any) -> tuple[float, dict[str, Any]]:
        """(reward, reward_info) from a raw result; None scores 0 and is counted."""
        if value is None:
            self.num_none += 1
            return 0.0, {"reward_none": 1.0}
        return normalize_reward(value)

    async def score(self, traj: Trajectory, tools: Any = None) -> tuple[float, dict[str, Any]]:
        """Score one trajectory: (reward, reward_info). Lets the function's exceptions through."""
        return self.to_score(await self(**reward_kwargs(traj, tools)))


def load_reward(spec: str | Callable[..., Any], run_in_thread: bool = False,
                bound: dict[str, Any] | None = None) -> RewardFn:
    """Resolve `path/to/file.py:fn` or `package.module:fn` to a `RewardFn`.

    Args:
        spec: the spec string; a callable is wrapped as is.
        run_in_thread: see `RewardFn`.
        bound: arguments fixed by the config; see `RewardFn`.

    Returns:
        The wrapped function.

    Raises:
        RewardLoadError: malformed spec, missing file, failing import, no such function, or a
            bound argument the function does not take.
    """
    if callable(spec):
        return RewardFn(spec, run_in_thread=run_in_thread, bound=bound)
    target, sep, fn_name = str(spec).rpartition(":")
    if not sep or not target or not fn_name:
        raise RewardLoadError(f"reward spec {spec!r} must look like 'path/to/file.py:function' "
                              "or 'package.module:function'")
    is_file = target.endswith(".py") or "/" in target or "\\" in target
    module = _import_file(target) if is_file else _import_module(target)
    fn = getattr(module, fn_name, None)
    if fn is None or not callable(fn):
        found = getattr(module, "__all__", None) or [
            n for n, v in vars(module).items() if inspect.isfunction(v) and not n.startswith("_")]
        what = "is not callable" if fn is not None else "not found"
        raise RewardLoadError(f"reward function {fn_name!r} {what} in {target}; "
                              f"callables there: {sorted(found) or 'none'}")
    # Errors name a file spec by its file name: a long absolute path would crowd out the sample.
    name = f"{Path(target).name if is_file else target}:{fn_name}"
    return RewardFn(fn, name=name, run_in_thread=run_in_thread, bound=bound, spec=str(spec))


def _import_file(target: str):
    path = Path(target).expanduser()
    if not path.is_file():
        raise RewardLoadError(f"reward file not found: {target} (looked at {path.resolve()})")
    # Like `python file.py`: sibling helper modules of the reward file are importable.
    if str(path.resolve().parent) not in sys.path:
        sys.path.insert(0, str(path.resolve().parent))
    try:
        return import_file(path, "_rl_factory_reward")
    except (Exception, SystemExit) as exc:
        raise RewardLoadError(f"importing reward file {target} failed: "
                              f"{type(exc).__name__}: {exc}") from exc


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


def reward_kwargs(traj: Trajectory, tools: Any = None) -> dict[str, Any]:
    """Every argument a reward function may name, for one trajectory.

    Args:
        traj: the finished trajectory.
        tools: the live tool env (or a `RewardTools` handle) behind the `tools` argument.
    """
    sample = traj.sample or {}
    available = {k: v for k, v in sample.items() if k not in REWARD_ARGS}
    available.update(
        completion=traj.completion,
        answer=sample.get("answer"),
        solution_str=traj.completion,  # a verl-style function may ask for the transcript instead (verl_style)
        ground_truth=sample.get("answer"),
        transcript=verl_style.transcript(traj),
        prompt=prompt_text(traj),
        messages=traj.messages,
        turns=[{"text": t.text, "tool_calls": [_call_dict(c) for c in t.tool_calls],
                "tool_results": [_result_dict(r) for r in t.tool_results],
                "num_tokens": len(t.generated_ids)} for t in traj.turns],
        tool_calls=[_call_dict(c) for c in traj.tool_calls],
        tool_results=[_result_dict(r) for r in traj.tool_results],
        sample=sample,
        num_turns=len(traj.turns),
        stop_reason=traj.stop_reason,
        data_source=sample.get("data_source"),
        extra_info=sample.get("extra_info"),
        tools=tools if isinstance(tools, RewardTools) else RewardTools(tools),
        state=traj.state,
    )
    return available


def _call_dict(call: ToolCall) -> dict[str, Any]:
    # `error` is set when the call text could not be parsed (arguments is then None).
    return {"name": call.name, "arguments": call.arguments, "error": call.error}


def _result_dict(result: ToolResult) -> dict[str, Any]:
    return {"name": result.call.name, "text": result.text, "ok": result.ok,
            "error_kind": result.error_kind}


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
    """Turn a real number or a {"score": ..., **metrics} dict into (reward, reward_info).

    Strict: a string ("0.9"), a bool (True), a tensor or anything else that is not a real number
    (Python or numpy) is an error, not silently converted: it is almost always a bug in the reward.
    """
    info: dict[str, Any] = {}
    if isinstance(value, dict):
        if "score" not in value:
            raise RewardError("reward returned a dict without a 'score' key "
                              f"(keys: {sorted(value)})")
        info = {k: v for k, v in value.items() if k != "score"}
        value = value["score"]
    if not _is_real(value):
        hint = " (call .item() on a tensor)" if type(value).__module__.startswith("torch") else ""
        raise RewardError(f"reward returned {type(value).__name__} {value!r:.80}; expected a real number, "
                          f"a dict with 'score', or None{hint}")
    score = float(value)
    if not math.isfinite(score):
        raise RewardError(f"reward returned a non-finite score {score}")
    return score, info


def _is_real(value: Any) -> bool:
    # numbers.Real covers int, float and numpy's numbers; bools (numpy's too) are not scores.
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and type(value).__name__ != "bool_"


def _columns(available: dict[str, Any]) -> list[str]:
    return sorted(k for k in available if k not in REWARD_ARGS)
