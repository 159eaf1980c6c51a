"""The async multi-turn agent loop: generate -> parse -> call tools -> append tokens -> repeat.

Token-faithful by construction: the trajectory's `token_ids` are the prompt ids, then per turn the
exact ids the engine generated (loss_mask 1, with the log-probs recorded at generation) and the
ids of the tool observation (loss_mask 0). The history is never re-rendered or re-tokenized; the
observation ids come from `ChatFormat.observation_ids`, a delta of the chat template.

Every trajectory is its own task. Nothing waits for the rest of the batch between turns: a
trajectory whose tool call returns early is generating its next turn while others still wait on
tools, and the engine batches whatever generation requests are pending at that moment.
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from rl_factory.chat import ChatFormat
from rl_factory.context import get_context_policy
from rl_factory.engines.base import Engine, SamplingParams, derive_seed
from rl_factory.types import Group, ToolResult, Trajectory, Turn

TRUNCATION_MARKER = " ...[truncated]"


@dataclass
class RolloutConfig:
    """The rollout's slice of the config (`rollout.*` plus `env.max_turns`)."""

    n: int = 8
    temperature: float = 1.0
    top_p: float = 1.0
    max_turns: int = 3
    max_response_tokens: int = 64
    max_total_tokens: int = 512
    max_tool_response_tokens: int = 128
    # Cap on the tokens after the prompt (generated + observations); None = only max_total_tokens.
    # Not a user key: the verl backend sets it to verl's response_length, which pads to it.
    max_tail_tokens: int | None = None
    # `append` (one token sequence per trajectory) or `step` (each turn its own sample; rl_factory/context.py)
    context: str = "append"
    # For `step`: how the history is cut before each turn, and how many turns it keeps
    context_processor: str = "last_turns"
    context_keep_turns: int = 2


class Agent:
    """Everything one rollout needs besides the sample: engine, tools, chat format and parser."""

    def __init__(self, engine: Engine, env: Any, fmt: ChatFormat, parser: Any, cfg: RolloutConfig):
        self.engine, self.env, self.fmt, self.parser, self.cfg = engine, env, fmt, parser, cfg
        self._spans: dict[str, list[tuple[float, float]]] = {"generate": [], "tools": []}

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

    async def rollout(self, sample: dict, sample_index: int, params: SamplingParams) -> Trajectory:
        """Run one trajectory of `sample` (a dataset row with normalized `messages`)."""
        cfg, fmt = self.cfg, self.fmt
        messages = [dict(m) for m in sample["messages"]]
        ctx = get_context_policy(cfg.context)(fmt, messages, cfg.max_total_tokens, max_tail_tokens=cfg.max_tail_tokens,
                                              processor=cfg.context_processor, keep_turns=cfg.context_keep_turns)
        turns: list[Turn] = []
        stop_reason = "max_turns"
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
            turn = Turn(gen.token_ids, gen.logprobs, text, tool_calls=calls)
            turns.append(turn)
            messages.append(_assistant_message(content, calls))
            if gen.finish_reason != "stop":
                stop_reason = "max_tokens"  # cut mid-turn: a half-written call is not executed
                break
            if not calls:
                stop_reason = "answer"
                break
            if turn_index == cfg.max_turns - 1:
                break  # no turn left to read the results: don't run the tools
            t0 = time.perf_counter()
            turn.tool_results = await self.env.call_batch(calls)
            self._spans["tools"].append((t0, time.perf_counter()))
            tool_messages = [{"role": "tool", "content": self._clip(r)} for r in turn.tool_results]
            messages += tool_messages
            obs = ctx.add_observation(tool_messages)
            if obs is None:
                stop_reason = "max_tokens"
                break
            turn.observation_ids = obs
        return Trajectory(sample_index=sample_index, prompt_ids=ctx.prompt_ids, token_ids=ctx.ids,
                          loss_mask=ctx.mask, logprobs=ctx.logprobs, messages=messages, turns=turns,
                          stop_reason=stop_reason, sample=sample, steps=ctx.steps)

    async def rollout_groups(self, samples: list[dict], indices: list[int], n: int, params: SamplingParams,
                             on_done: Callable[[Trajectory], Any] | None = None) -> list[Group]:
        """All n trajectories of every sample, concurrently; returned grouped by sample.

        `on_done(traj)` is called as each trajectory finishes (the trainer starts scoring it there).
        With `params.seed`, trajectory k of the sample at batch position j samples with its own seed
        derived from (seed, sample index, j, k), so the result does not depend on which trajectory runs first.
        """
        async def rollout_one(sample: dict, index: int, position: int, k: int) -> Trajectory:
            traj = await self.rollout(sample, index, replace(params, seed=derive_seed(params.seed, index, position, k)))
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
