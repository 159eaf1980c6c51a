"""The one reward path: every call of a run's reward code goes through one `Scorer`.

    scorer = build_scorer(cfg.reward)          # functions + weights, process reward, executor, timeout, on_error
    scorer.use_tools(env)                      # what a reward's `tools` argument calls
    groups = await agent.rollout_groups(samples, indices, n, params, on_done=scorer.submit)
    metrics = await scorer.wait(trajs)         # the last few, then errors and the batch's metrics

Outcome rewards (`reward.function` / weighted `reward.functions`, LLM judge rewards among them),
per-turn process rewards (`reward.process`), the pairwise reward judge of ArenaRL
(`score_kwargs`) and verl's reward workers (`rl_factory.backends.verl.reward`) all call user code
through `Scorer.call`, the single place that decides where a sync function runs (`executor`:
inline, thread or worker processes; rewards.executors), how long it may take (`timeout_s`, for
process rewards too), what the result must be (a real number, a dict with one, or None: never a
string or a bool; at most `max_abs` in magnitude, since a finite 1e308 overflows the advantage
estimators' means and variances into inf and NaN) and what a failure does (`on_error`: stop the run with a `RewardError` naming the
sample, or score 0 and count it). Any exception counts as a failure, `SystemExit` included; only
cancellation and Ctrl-C pass through.

`submit` starts scoring one trajectory at once (at most `max_concurrency` at a time); `wait` scores
whatever was not submitted, waits for all, and then raises the first failure in the order of
`trajs`, so the error names the same sample on every run however the rollouts happened to finish.
"""
from __future__ import annotations

import asyncio
import statistics
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from rl_factory.base.secrets import redact_known
from rewards.combine import ON_ERROR, Component, RewardConfig, build_components, describe_failure
from rewards.executors import get_executor
from rewards.loader import RewardError, RewardFn, RewardLoadError, RewardTools, reward_kwargs
from rewards.process import ProcessReward, turn_kwargs
from rl_factory.base.usercode import passes_through
from rl_factory.base.loop_local import LoopLocal
from rl_factory.base.types import EPISODE_FAILED

# reward_info keys that count failures (logged as reward/none_count, reward/errors, ...), not a reward's extras
COUNTERS = ("reward_none", "reward_error", "errors", "episode_error")


def reward_info_metrics(infos: list[dict[str, Any] | None]) -> dict[str, float]:
    """`reward/<key>/mean` for every number in the trajectories' `reward_info`, over those that have it: the
    numbers a reward returned beside its score (verl's `{"score": s, "acc": 1.0}` gives `reward/acc/mean`),
    and each named component's score and extras (`reward/<name>/mean`, `reward/<name>/<key>/mean`). Both
    backends log them from their rollouts (rl_factory.evaluate.summarize_records). A `reward_info` in the form
    verl's reward workers return (`score_result`: `score`, `reward/<key>`, ...) counts its `reward/*` keys."""
    values: dict[str, list[float]] = {}
    for info in infos:
        info = info or {}
        if any(k.startswith("reward/") for k in info):
            info = {k.removeprefix("reward/"): v for k, v in info.items() if k.startswith("reward/")}
        for key, value in info.items():
            if key.rpartition("/")[2] in COUNTERS or isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            values.setdefault(key, []).append(float(value))
    return {f"reward/{key}/mean": statistics.fmean(v) for key, v in values.items()}


class Scorer:
    """A run's reward code and the policy it runs under (see the module docstring).

    Args:
        components: the weighted outcome functions; names must be unique.
        process: per-turn process rewards (None or disabled: none).
        on_error: "raise" (stop, naming the sample) or "zero" (score 0, counted).
        executor: where sync functions run: "inline", "thread" or "process" (rewards.executors).
        timeout_s: a call running longer is an error; None waits forever.
        named: keep and log each component under its name (`reward.functions`); False for the
            single `reward.function`, whose reward_info keeps the function's own keys.
        max_workers: processes of the "process" executor.
        max_concurrency: trajectories scored at once by `submit`/`wait`.
        max_abs: a score of larger magnitude is a failure (None: no bound).
    """

    def __init__(self, components: list[Component], process: ProcessReward | None = None, *,
                 on_error: str = "raise", executor: str = "inline", timeout_s: float | None = None,
                 named: bool = True, max_workers: int = 4, max_concurrency: int = 64,
                 max_abs: float | None = 1e6):
        if on_error not in ON_ERROR:
            raise RewardLoadError(f"reward.on_error: unknown value {on_error!r} (valid: {', '.join(ON_ERROR)})")
        names = [c.name for c in components]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise RewardLoadError(f"reward.functions: name {duplicates[0]!r} is used twice; "
                                  "give each entry its own `name`")
        self.components, self.on_error, self.timeout_s, self.named = components, on_error, timeout_s, named
        self.process = process if process is not None and process.enabled else None
        self.executor_name = executor
        self.executor = get_executor(executor, max_workers=max_workers)
        for fn in [c.fn for c in components] + ([self.process.fn] if self.process and self.process.fn else []):
            self.executor.check(fn)
        self.name = " + ".join(f"{c.weight:g}*{c.name}" for c in components) if named else components[0].fn.name
        self.max_concurrency, self.max_abs = max_concurrency, max_abs
        self.tools = RewardTools(None)
        self._slots = LoopLocal(lambda: asyncio.Semaphore(self.max_concurrency))
        self._tasks: dict[int, asyncio.Task] = {}  # id(trajectory) -> its scoring task

    @classmethod
    def wrap(cls, reward: Scorer | RewardFn | Callable[..., Any]) -> Scorer:
        """A `Scorer` as is; a `RewardFn` or plain callable as a single unnamed component."""
        if isinstance(reward, Scorer):
            return reward
        fn = reward if isinstance(reward, RewardFn) else RewardFn(reward)
        return cls([Component(fn.name, fn)], named=False, executor="thread" if fn.run_in_thread else "inline")

    def sibling(self, fn: RewardFn) -> Scorer:
        """Another function under this scorer's policy (executor, timeout, on_error)."""
        return Scorer([Component(fn.name, fn)], named=False, on_error=self.on_error, executor=self.executor_name,
                      timeout_s=self.timeout_s, max_workers=self.executor.max_workers, max_abs=self.max_abs)

    def use_tools(self, env: Any) -> Scorer:
        """Give reward functions that name `tools` this env (a live ToolEnv, or an episode handle)."""
        self.tools = env if isinstance(env, RewardTools) else RewardTools(env)
        return self

    # ---- the one call path ----------------------------------------------------------------------

    async def call(self, fn: RewardFn, available: dict[str, Any],
                   describe: Callable[[dict[str, Any], BaseException], str]) -> tuple[float, dict[str, Any]]:
        """Run `fn` on the arguments it names from `available`: (score, extras), or under
        `on_error=zero` (0.0, {"reward_error": ...}) when it fails.

        Raises:
            RewardError: it failed (raised, timed out, returned a non-score) and `on_error` is "raise";
                `describe(kwargs, exc)` is the message.
        """
        kwargs: dict[str, Any] = {}
        try:
            kwargs = fn.select_kwargs(available)
            score, extras = fn.to_score(await self.executor.run(fn, kwargs, self.timeout_s))
            if self.max_abs is not None and abs(score) > self.max_abs:
                raise RewardError(f"reward returned {score:g}, outside [-{self.max_abs:g}, {self.max_abs:g}] "
                                  "(reward.max_abs)")
            return score, extras
        except BaseException as exc:  # noqa: BLE001 - user code: anything but our cancel / Ctrl-C
            if passes_through(exc):
                raise
            if self.on_error == "raise":
                raise RewardError(describe(kwargs, exc)) from exc
            # scrubbed before it is cut: a cut through a secret would leave its head unrecognisable
            return 0.0, {"reward_error": redact_known(f"{type(exc).__name__}: {exc}")[:200]}

    # ---- scoring --------------------------------------------------------------------------------

    async def score(self, traj: Trajectory, tools: Any = None) -> float:
        """Score one trajectory: sets `traj.reward`, `traj.reward_info` and (with process rewards)
        `traj.process_rewards`; returns the reward."""
        if traj.stop_reason == EPISODE_FAILED:  # nothing ran: there is nothing to score (it trains nothing)
            traj.reward = None
            return 0.0
        tools = self.tools if tools is None else RewardTools(tools, counter=self.tools)
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
        if self.process is not None:
            traj.process_rewards, errors = await self._process(traj)
            if errors:
                info["process/errors"] = errors
        traj.reward, traj.reward_info = total, info
        return total

    async def _component(self, c: Component, available: dict[str, Any],
                         traj: Trajectory) -> tuple[float, dict[str, Any]]:
        return await self.call(c.fn, available, lambda kwargs, exc: describe_failure(c.fn.name, traj, kwargs, exc))

    async def _process(self, traj: Trajectory) -> tuple[list[float], int]:
        """One reward per turn: the per-turn function's score plus the penalty per failed call."""
        rewards, errors = [], 0
        for i, turn in enumerate(traj.turns):
            failed = sum(not res.ok for res in turn.tool_results)
            r = self.process.cfg.tool_error_penalty * failed if failed else 0.0
            if self.process.fn is not None:
                fn = self.process.fn
                value, extras = await self.call(fn, turn_kwargs(traj, i), lambda kwargs, exc, i=i: (
                    f"process reward {fn.name} failed on sample {traj.sample_index} turn {i}: "
                    f"{type(exc).__name__}: {redact_known(str(exc))[:200]}"))
                errors += "reward_error" in extras
                r += value
            rewards.append(float(r))
        return rewards, errors

    def outcome(self, traj: Trajectory) -> float:
        """The reward an outcome estimator sees: the outcome plus (outcome_mode=sum) the process rewards."""
        extra = sum(traj.process_rewards) if self.process and self.process.cfg.outcome_mode == "sum" else 0.0
        return float(traj.reward or 0.0) + extra

    async def score_kwargs(self, **available: Any) -> float:
        """The weighted score from ready-made arguments (what the pairwise reward judge calls)."""
        total = 0.0
        for c in self.components:
            value, _ = await self.call(c.fn, available, lambda kwargs, exc, c=c: (
                f"reward {c.fn.name} failed while judging: {type(exc).__name__}: {redact_known(str(exc))[:200]}"))
            total += c.weight * value
        return total

    # ---- a step's batch -------------------------------------------------------------------------

    def submit(self, traj: Trajectory, tools: Any = None) -> asyncio.Future:
        """Start scoring `traj` (from inside the event loop) and return its task, which never needs to be
        awaited for errors (`wait` reports them); a second submit returns the first one's task.

        `tools`: what the reward's `tools` argument calls for this trajectory (its episode; None: the
        scorer's own, `use_tools`). The rollout awaits the task before it closes the episode.
        """
        if id(traj) not in self._tasks:
            self._tasks[id(traj)] = asyncio.ensure_future(self._score_bounded(traj, tools))
        return self._tasks[id(traj)]

    async def _score_bounded(self, traj: Trajectory, tools: Any = None) -> None:
        async with self._slots.get():
            await self.score(traj, tools)

    async def wait(self, trajs: list[Trajectory]) -> dict[str, float]:
        """Score every trajectory of `trajs` (submitted or not) and return the batch's metrics.

        Returns:
            `reward/none_count` (calls that returned None), `reward/errors` (calls that failed and
            scored 0 under `on_error: zero`), `reward/<name>/mean` per named component,
            `reward/tool_calls` when the reward called tools, and with process rewards
            `reward/process/mean` and `reward/process/errors`.

        Raises:
            RewardError: the first failure in the order of `trajs`, naming its sample.
        """
        for traj in trajs:
            self.submit(traj)
        tasks = [self._tasks.pop(id(t)) for t in trajs]
        # return_exceptions: every call finishes before one is reported (see the module docstring).
        results = await asyncio.gather(*tasks, return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                raise result
        return self.metrics(trajs)

    def metrics(self, trajs: list[Trajectory]) -> dict[str, float]:
        infos = [t.reward_info for t in trajs]
        metrics = {"reward/none_count": float(sum(k.endswith("reward_none") for i in infos for k in i)),
                   "reward/errors": float(sum(k.endswith("reward_error") for i in infos for k in i))}
        if self.named and trajs:
            for c in self.components:
                metrics[f"reward/{c.name}/mean"] = statistics.fmean(float(i.get(c.name, 0.0)) for i in infos)
        if self.process is not None and trajs:
            metrics["reward/process/mean"] = statistics.fmean(sum(t.process_rewards) for t in trajs)
            metrics["reward/process/errors"] = float(sum(i.get("process/errors", 0) for i in infos))
        if self.tools.num_calls:
            metrics["reward/tool_calls"] = float(self.tools.num_calls)
            self.tools.num_calls = 0
        return metrics

    def close(self) -> None:
        """Stop worker processes, if any."""
        self.executor.close()


def build_scorer(cfg: RewardConfig) -> Scorer:
    """The run's `Scorer` from its `reward.*` slice.

    Raises:
        RewardLoadError: both or a malformed `functions` entry, a spec that does not load, an
            unknown `on_error` / `executor` / process `outcome_mode`, or a function the executor cannot run.
    """
    components, named = build_components(cfg)
    try:
        process = ProcessReward(cfg.process)
    except ValueError as exc:
        raise RewardLoadError(str(exc)) from None
    return Scorer(components, process, named=named, on_error=cfg.on_error, executor=cfg.executor,
                  timeout_s=cfg.timeout_s, max_workers=max(1, cfg.max_concurrency),
                  max_concurrency=cfg.max_concurrency, max_abs=cfg.max_abs)


async def score_trajectories(reward: Any, trajs: list[Trajectory], max_concurrency: int | None = None,
                             tools: Any = None) -> dict[str, float]:
    """Set `traj.reward` and `traj.reward_info` of every trajectory of a finished batch.

    Args:
        reward: a `Scorer`, a `RewardFn` (from `load_reward`) or a plain function.
        trajs: the trajectories to score, modified in place.
        max_concurrency: trajectories scored at once (None: the scorer's own).
        tools: the live tool env behind the reward's `tools` argument (None: the scorer's own).

    Returns:
        The batch's metrics (see `Scorer.wait`).

    Raises:
        RewardError: naming the first failing trajectory (in list order) by sample index, `id`
            and prompt, chained to the user function's exception.
    """
    scorer = Scorer.wrap(reward)
    if tools is not None:
        scorer.use_tools(tools)
    if max_concurrency is not None:
        scorer.max_concurrency = max_concurrency
    return await scorer.wait(trajs)
