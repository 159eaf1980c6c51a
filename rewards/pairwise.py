"""What every pairwise model judge is made of: the candidate a judge sees (`Candidate`), the prompt that
shows two of them, the judge's config slice (`JudgeConfig`) and `PairwiseModelJudge`, which judges each
comparison both ways and caches verdicts by ordered pair. `rewards.judge` builds the judges; `LLMJudge`
(there) and `HFJudge` (`rewards.hf_judge`) subclass `PairwiseModelJudge`.
"""
from __future__ import annotations

import asyncio
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from rewards.chat import CACHE_SIZE, fill_template, load_template
from rl_factory.base.usercode import passes_through
from rl_factory.base.judging import JudgeError

DEFAULT_PROMPT = """\
You are comparing two AI agents that answered the same user request, possibly by calling tools.
Judge the tool-call path (were the right tools called with sensible arguments, enough and no more) and
the final answer (correct, complete, relevant, clear). Do not prefer an answer for its position or length.

[USER REQUEST]
{query}

[AGENT A: TOOL-CALL PATH]
{path_a}
[AGENT A: FINAL ANSWER]
{answer_a}

[AGENT B: TOOL-CALL PATH]
{path_b}
[AGENT B: FINAL ANSWER]
{answer_b}

Reply with one JSON object and nothing else:
{"reason": "<one or two sentences>", "score_a": <0-10>, "score_b": <0-10>, "winner": "A" | "B" | "tie"}
"""
PLACEHOLDERS = ("{query}", "{path_a}", "{answer_a}", "{path_b}", "{answer_b}")
NO_PATH = "(no tool calls)"


@dataclass(frozen=True)
class Candidate:
    """One rollout as a judge sees it.

    Attributes:
        answer: the final answer text.
        path: the rendered tool-call path (per step: reasoning text and tool calls).
        reward: its pointwise reward when already known (reward comparators use it).
        reward_kwargs: the arguments a reward function may name (see `rewards.loader`).
    """

    answer: str
    path: str = ""
    reward: float | None = field(default=None, compare=False)
    reward_kwargs: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    @classmethod
    def from_trajectory(cls, traj: Any) -> Candidate:
        """A candidate from an `rl_factory.base.types.Trajectory` (its messages, reward and reward arguments)."""
        from rewards.loader import reward_kwargs

        return cls(answer=final_answer(traj.messages), path=render_path(traj.messages), reward=traj.reward,
                   reward_kwargs=reward_kwargs(traj))


def final_answer(messages: list[dict]) -> str:
    """The content of the last assistant message ("" if there is none)."""
    replies = [m for m in messages if m.get("role") == "assistant"]
    return str(replies[-1].get("content") or "") if replies else ""


def render_path(messages: list[dict]) -> str:
    """Each assistant step's reasoning and tool calls, one block per step; tool outputs left out."""
    steps = []
    for m in (m for m in messages if m.get("role") == "assistant" and m.get("tool_calls")):
        calls = [c.get("function", c) for c in m["tool_calls"]]
        lines = [f"Step {len(steps) + 1}: {(m.get('content') or '').strip()}".rstrip()]
        for c in calls:
            args = c.get("arguments")
            lines.append(f"  call {c.get('name')}({args if isinstance(args, str) else json.dumps(args)})")
        steps.append("\n".join(lines))
    return "\n".join(steps)


def render_prompt(template: str, query: str, a: Candidate, b: Candidate) -> str:
    """Fill the five placeholders by plain replacement (JSON braces in a template need no escaping)."""
    return fill_template(template, dict(zip(PLACEHOLDERS, (query, a.path or NO_PATH, a.answer,
                                                           b.path or NO_PATH, b.answer))))


def load_prompt(prompt: str | None) -> str:
    """The default prompt, a template file's text, or an inline template (it must use {answer_a}/{answer_b})."""
    return load_template(prompt, DEFAULT_PROMPT, ("{answer_a}", "{answer_b}"), "judge prompt")


@dataclass
class JudgeConfig:
    """`algorithm.arena.judge.*`: which judge compares two rollouts, and how it is reached."""

    type: str = "reward"
    reward_function: str | None = None
    base_url: str = "http://127.0.0.1:8000/v1"
    model: str = ""
    api_key_env: str | None = "OPENAI_API_KEY"
    model_path: str | None = None
    device: str = "cpu"
    prompt: str | None = None
    max_concurrency: int = 8
    max_retries: int = 3
    backoff_s: float = 1.0
    timeout_s: float = 60.0
    temperature: float = 0.0
    max_tokens: int = 512
    extra_body: dict[str, Any] = field(default_factory=dict)


class PairwiseModelJudge:
    """Shared by the model judges: both orders per comparison, a cache by ordered pair, request stats."""

    def __init__(self, prompt: str | None = None):
        self.template = load_prompt(prompt)
        self._cache: dict[str, asyncio.Future] = {}
        self.stats = {"requests": 0, "cache_hits": 0, "retries": 0}

    async def compare(self, query: str, a: Candidate, b: Candidate) -> float:
        first, second = await asyncio.gather(self._verdict(query, a, b), self._verdict(query, b, a))
        return (first + 1.0 - second) / 2

    async def _verdict(self, query: str, a: Candidate, b: Candidate) -> float:
        prompt = render_prompt(self.template, query, a, b)
        key = hashlib.sha256(prompt.encode()).hexdigest()
        if key in self._cache:  # a finished verdict, or one in flight (concurrent equal requests share it)
            self.stats["cache_hits"] += 1
            return await asyncio.shield(self._cache[key])
        future = self._cache[key] = asyncio.get_running_loop().create_future()
        try:
            value = await self.judge_prompt(prompt)
        except BaseException as original:
            exc = original
            if not isinstance(exc, JudgeError) and not passes_through(exc):
                # e.g. a local model out of memory: a failed verdict, for on_judge_failure to handle
                exc = JudgeError(f"judge failed: {type(exc).__name__}: {exc}")
            self._cache.pop(key, None)  # failures are not cached: a later match may try again
            if isinstance(exc, asyncio.CancelledError):
                future.cancel()
            else:
                future.set_exception(exc)
                future.exception()  # marks it retrieved; waiters re-raise it
            if exc is original:
                raise
            raise exc from original
        future.set_result(value)
        while len(self._cache) > CACHE_SIZE:  # oldest first (dicts keep insertion order)
            del self._cache[next(iter(self._cache))]
        return value

    async def judge_prompt(self, prompt: str) -> float:
        """P(A beats B) for one rendered prompt; raises JudgeError when no verdict can be had."""
        raise NotImplementedError
