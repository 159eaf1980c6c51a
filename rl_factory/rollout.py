"""The async multi-turn agent loop: generate -> parse -> call tools -> append tokens -> repeat.

Token-faithful by construction: the trajectory's `token_ids` are the prompt ids, then per turn the
exact ids the engine generated (loss_mask 1, with the log-probs recorded at generation) and the
ids of the tool observation (loss_mask 0). The history is never re-rendered or re-tokenized; the
observation ids come from `ChatFormat.observation_ids`, a delta of the chat template.

Every trajectory is its own task. Nothing waits for the rest of the batch between turns: a
trajectory whose tool call returns early is generating its next turn while others still wait on
tools, and the engine batches whatever generation requests are pending at that moment.

Each trajectory runs in its own episode (envs.episode): its tools are called through the episode's
handle, never the run-wide env, and `rollout_groups` scores it with that same handle (the reward's
`tools`) before closing the episode. With an environment (`env.environment`), `reset(sample)`'s messages
join the prompt, and after every assistant turn (its tool results appended) `step(trajectory)` may
answer, as the user, in the same observation delta as the tool results (mask 0), or end the episode
(stop_reason "env_done"); a turn without tool calls then ends the trajectory only if the environment
says nothing. A sample whose episode cannot open, or whose environment raises, becomes a trajectory
with stop_reason and dropped_by EPISODE_FAILED (no tokens, not scored, not trained), one warning
naming the sample, and the other trajectories go on.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from rl_factory.chat import ChatFormat
from rl_factory.context import get_context_policy
from rl_factory.engines.base import Engine, SamplingParams, derive_seed
from envs.environment import check_messages
from envs.episode import EpisodeError
from rl_factory.base.types import EPISODE_FAILED, Group, ToolResult, Trajectory, Turn

log = logging.getLogger("rl_factory")
TRUNCATION_MARKER = " ...[truncated]"
OBSERVATION_ROLES = ("user", "tool")  # what an environment's step may say (assistant tokens are the policy's)


@dataclass
class RolloutKeys:
    """The `rollout.*` keys the rollout loop reads (the rest of the slice: components.SamplingConfig)."""

    n: int = 8
    temperature: float = 1.0
    top_p: float = 1.0
    max_response_tokens: int = 64
    max_total_tokens: int = 512
    max_tool_response_tokens: int = 128
    # `append` (one token sequence per trajectory) or `step` (each turn its own sample; rl_factory/context.py)
    context: str = "append"
    # For `step`: how the history is cut before each turn, and how many turns it keeps
    context_processor: str = "last_turns"
    context_keep_turns: int = 2


@dataclass
class RolloutConfig(RolloutKeys):
    """The rollout loop's settings: its `rollout.*` keys plus two that are no `rollout.*` key of their own
    (components.loop_config builds it from the slices)."""

    max_turns: int = 3  # env.max_turns (the same default: tests/test_config_defaults.py)
    # Cap on the tokens after the prompt (generated + observations); None = only max_total_tokens.
    # Set by the verl backend to verl's response_length, which pads to it.
    max_tail_tokens: int | None = None


class Agent:
    """Everything one rollout needs besides the sample: engine, tools, chat format and parser."""

    def __init__(self, engine: Engine, env: Any, fmt: ChatFormat, parser: Any, cfg: RolloutConfig):
        self.engine, self.env, self.fmt, self.parser, self.cfg = engine, env, fmt, parser, cfg
        self._spans: dict[str, list[tuple[float, float]]] = {"generate": [], "tools": []}
        self._warned: set[str] = set()
        # Async training with whole-trajectory versions (rl_factory/asynchrony.py): every episode runs inside
        # `gate.trajectory()`, so new weights reach the engine only between trajectories. None: no gate.
        self.gate: Any = None

    def timing(self) -> dict[str, float]:
        """Wall time spent generating, in tools, and how much tool time overlapped generation.

        Measured from the (start, end) spans of every generate and call_batch since the last call:
        `timing/tools_hidden` is the share of tool wall time during which the engine was also
        generating for some other trajectory (1.0 = tools fully hidden; lockstep loops score 0).
        """
        gen, tools = _union(self._spans["generate"]), _union(self._spans["tools"])
        self._spans = {"generate": [], "tools": []}
        tool_s = _length(tools)
        hidden = _length(_intersect(gen, tools))
        return {"timing/generate_s": _length(gen), "timing/tools_s": tool_s,
                "timing/tools_hidden": hidden / tool_s if tool_s else float("nan")}

    async def rollout(self, sample: dict, sample_index: int, params: SamplingParams,
                      episode: Any = None) -> Trajectory:
        """Run one trajectory of `sample` (a dataset row with normalized `messages`) in `episode`.

        `episode` is the handle its tools are called through (envs.episode); None opens one for this call
        and closes it on return (an env without episodes, e.g. a test double, is called directly).

        Raises:
            EpisodeError: the episode did not open (episode None), or its environment failed.
        """
        if episode is None and hasattr(self.env, "open_episode"):
            async with self.env.episode(sample) as own:
                return await self.rollout(sample, sample_index, params, own)
        tools = episode if episode is not None else self.env
        world = getattr(episode, "environment", None)
        cfg, fmt = self.cfg, self.fmt
        messages = [dict(m) for m in sample["messages"]]
        if world is not None:  # the environment's opening words are part of the prompt
            messages += await environment_reset(world, sample)
        ctx = get_context_policy(cfg.context)(fmt, messages, cfg.max_total_tokens, max_tail_tokens=cfg.max_tail_tokens,
                                              processor=cfg.context_processor, keep_turns=cfg.context_keep_turns)
        turns: list[Turn] = []
        stop_reason = "max_turns"

        def so_far(reason: str) -> Trajectory:
            return Trajectory(sample_index=sample_index, prompt_ids=ctx.prompt_ids, token_ids=ctx.ids,
                              loss_mask=ctx.mask, logprobs=ctx.logprobs, messages=messages, turns=turns,
                              stop_reason=reason, sample=sample, steps=ctx.steps)

        for turn_index in range(cfg.max_turns):
            prompt = ctx.next_prompt(messages if turn_index else [])
            budget = min(cfg.max_response_tokens, ctx.budget())
            if budget <= 0:
                stop_reason = "max_tokens"
                break
            t0 = time.perf_counter()
            turn_params = replace(params, max_new_tokens=budget, seed=derive_seed(params.seed, turn_index))
            gen = await self.engine.generate(prompt, turn_params)
            self._spans["generate"].append((t0, time.perf_counter()))
            ctx.add_generation(gen)
            text = fmt.tokenizer.decode(gen.token_ids, skip_special_tokens=True)
            content, calls = self.parser.parse(text)
            turn = Turn(gen.token_ids, gen.logprobs, text, tool_calls=calls, receipt=gen.receipt,
                        version_spans=gen.version_spans)
            turns.append(turn)
            messages.append(_assistant_message(content, calls))
            if gen.finish_reason != "stop":
                stop_reason = "max_tokens"  # cut mid-turn: a half-written call is not executed
                break
            last = turn_index == cfg.max_turns - 1  # no turn left to read results: tools don't run
            observation: list[dict] = []
            if calls and not last:
                t0 = time.perf_counter()
                turn.tool_results = await tools.call_batch(calls)
                self._spans["tools"].append((t0, time.perf_counter()))
                observation = [{"role": "tool", "content": self._clip(r)} for r in turn.tool_results]
                messages += observation
            spoken: list[dict] = []
            if world is not None:  # it sees every turn, the last one too (its state must be current)
                spoken, done = await environment_step(world, so_far("running"))
                if done:
                    stop_reason = "env_done"
                    break
                if not last:
                    messages += spoken
                    observation += spoken
            if not calls and not spoken:
                stop_reason = "answer"
                break
            if last:
                break
            obs = ctx.add_observation(observation)
            if obs is None:
                stop_reason = "max_tokens"
                break
            turn.observation_ids = obs
        traj = so_far(stop_reason)
        if world is not None:
            traj.state = dict(getattr(episode, "state", {}) or {})
        return traj

    async def run_episode(self, sample: dict, sample_index: int, params: SamplingParams,
                          scorer: Any = None) -> Trajectory:
        """Open `sample`'s episode, roll out in it, score in it (`scorer.submit`), close it.

        A failed episode (or environment) gives a dropped EPISODE_FAILED trajectory instead of raising;
        a reward's failure is left for `scorer.wait` to report, in order.
        """
        if self.gate is not None:
            async with self.gate.trajectory():
                return await self._run_episode(sample, sample_index, params, scorer)
        return await self._run_episode(sample, sample_index, params, scorer)

    async def _run_episode(self, sample: dict, sample_index: int, params: SamplingParams,
                           scorer: Any = None) -> Trajectory:
        try:
            episode = await self.env.open_episode(sample) if hasattr(self.env, "open_episode") else None
        except EpisodeError as exc:
            return self._failed(sample, sample_index, exc)
        try:
            traj = await self.rollout(sample, sample_index, params, episode)
            if scorer is not None:  # before the episode closes: a reward's `tools` reach its servers
                await asyncio.wait([scorer.submit(traj, tools=episode)])
        except EpisodeError as exc:
            traj = self._failed(sample, sample_index, exc)
        finally:
            if episode is not None:  # its processes exit in the background: the trajectory is done
                await episode.close(wait=False)
        return traj

    def _failed(self, sample: dict, sample_index: int, exc: EpisodeError) -> Trajectory:
        where = f"sample {sample_index}" + (f" (id {sample['id']!r})" if sample.get("id") is not None else "")
        message = f"{where}: {exc}"
        if message not in self._warned:  # one line per sample and cause, not one per trajectory
            self._warned.add(message)
            log.warning("%s; its trajectory is dropped from its group (counted in episode/dropped)", message)
        return Trajectory(sample_index=sample_index, prompt_ids=[], token_ids=[], loss_mask=[], logprobs=[],
                          messages=[dict(m) for m in sample.get("messages", [])], turns=[],
                          stop_reason=EPISODE_FAILED, sample=sample, dropped_by=EPISODE_FAILED,
                          reward_info={"episode_error": str(exc)[:500]})

    async def rollout_groups(self, samples: list[dict], indices: list[int], n: int, params: SamplingParams,
                             on_done: Callable[[Trajectory], Any] | None = None, scorer: Any = None) -> list[Group]:
        """All n trajectories of every sample, concurrently, each in its own episode; grouped by sample.

        `scorer` (rewards.scorer.Scorer) scores each trajectory inside its episode, before it closes;
        `scorer.wait(trajs)` afterwards reports failures and the batch's metrics. `on_done(traj)` is called
        as each trajectory finishes (scored, if a scorer was given).
        With `params.seed`, trajectory k of the sample at batch position j samples with its own seed
        derived from (seed, sample index, j, k), so the result does not depend on which trajectory runs first.
        """
        async def rollout_one(sample: dict, index: int, position: int, k: int) -> Trajectory:
            seeded = replace(params, seed=derive_seed(params.seed, index, position, k))
            traj = await self.run_episode(sample, index, seeded, scorer)
            if on_done is not None:
                on_done(traj)
            return traj

        tasks = [rollout_one(s, i, j, k) for j, (s, i) in enumerate(zip(samples, indices)) for k in range(n)]
        trajs = await asyncio.gather(*tasks)
        return [Group(i, list(trajs[k * n: (k + 1) * n])) for k, i in enumerate(indices)]

    def _clip(self, result: ToolResult) -> str:
        """Truncate a tool's text to the token budget, visibly, so the model knows it is partial.

        Only a prefix is tokenized (doubling until it holds more tokens than the budget, or is the
        whole text), so a huge result costs about as much as the budget, not its own length.
        """
        text, budget = result.text, self.cfg.max_tool_response_tokens
        prefix_chars = 8 * budget + 64
        while True:
            ids = self.fmt.encode(text[:prefix_chars])
            if len(ids) > budget:
                return self.fmt.tokenizer.decode(ids[:budget]) + TRUNCATION_MARKER
            if prefix_chars >= len(text):
                return text
            prefix_chars *= 2


def _assistant_message(content: str, calls: list) -> dict:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = [
            {"type": "function", "function": {"name": c.name, "arguments": c.arguments if c.arguments is not None else c.raw}}
            for c in calls
        ]
    return message


async def environment_reset(world: Any, sample: dict) -> list[dict]:
    """`world.reset(sample)`'s messages, checked (EpisodeError if it raises or returns something else)."""
    return _checked(await _hook(world.reset(sample), "reset"), "environment reset()", None)


async def environment_step(world: Any, trajectory: Trajectory) -> tuple[list[dict], bool]:
    """`world.step(trajectory)`'s (messages, done), checked (EpisodeError if it raises or returns something else)."""
    return _step_result(await _hook(world.step(trajectory), "step"))


async def _hook(awaitable: Any, name: str) -> Any:
    """Await an environment hook; what it raises fails this episode only (EpisodeError)."""
    try:
        return await awaitable
    except Exception as exc:  # noqa: BLE001 - user code; cancellation and Ctrl-C pass through
        raise EpisodeError(f"environment {name}() raised {type(exc).__name__}: {exc}") from exc


def _step_result(result: Any) -> tuple[list[dict], bool]:
    if not (isinstance(result, tuple) and len(result) == 2 and isinstance(result[1], bool)):
        raise EpisodeError(f"environment step() returned {result!r:.80}; expected (messages, done)")
    return _checked(result[0], "environment step()", OBSERVATION_ROLES), result[1]


def _checked(messages: Any, where: str, roles: tuple[str, ...] | None) -> list[dict]:
    try:
        return check_messages(messages, where, roles)
    except ValueError as exc:
        raise EpisodeError(str(exc)) from None


def _union(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[tuple[float, float]] = []
    for start, end in sorted(spans):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def _intersect(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        start, end = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if start < end:
            out.append((start, end))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def _length(spans: list[tuple[float, float]]) -> float:
    return sum(end - start for start, end in spans)
