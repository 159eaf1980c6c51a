"""Pairwise judges for ArenaRL tournaments: an LLM over any OpenAI-compatible chat endpoint, a local
Hugging Face model, and a comparator built from any pointwise reward function.

A judge has one method, `await judge.compare(query, a, b) -> float in [0, 1]`: the chance that candidate
`a` is better than candidate `b` for `query`. Model judges judge every comparison **both ways** (a shown
as "A" and as "B") and average, `(v(a, b) + 1 - v(b, a)) / 2`, which cancels position bias: a judge that
always prefers the first slot scores every pair 0.5. So one tournament match costs two model calls.

`LLMJudge` (configured through `JudgeConfig`) calls a `ChatClient` (`rewards.chat`), which the pointwise
judge reward (`rewards.llm_reward`) shares: an httpx async client (httpx2, which the MCP SDK brings)
posting to `{base_url}/chat/completions`, the API key read from the environment variable named by
`api_key_env` (never from the config), at most `max_concurrency` requests in flight, retries with
exponential backoff and jitter on transport errors, HTTP 408/429/5xx and replies without a verdict (other
4xx fail at once), and a cache keyed by the ordered pair of candidates' content, so a rematch or the
reversed order of a judged pair is free. When a comparison still fails it raises `JudgeError`; the
tournament counts it and applies its `on_judge_failure` policy. The default prompt (adapted from the
ArenaRL reference's travel judge, in English) shows the query, each candidate's tool-call path (its
reasoning and tool calls, not the tool outputs) and final answer, and asks for JSON with a winner.
`parse_verdict` also reads `[[A]]`-style, "Winner: B" and the reference's `combined_scores` replies.
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rewards.chat import CACHE_SIZE, ChatClient, JudgeError, fill_template, json_objects, load_template
from rl_factory.usercode import passes_through
from rl_factory.registry import Registry

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
        """A candidate from an `rl_factory.types.Trajectory` (its messages, reward and reward arguments)."""
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


_WINNER = {"a": 1.0, "agent_a": 1.0, "b": 0.0, "agent_b": 0.0, "tie": 0.5, "draw": 0.5, "equal": 0.5}


def parse_verdict(text: str) -> float:
    """P(A beats B) from a judge reply: JSON `winner` (or `score_a`/`score_b`, or the reference's
    `combined_scores` of Agent_A/Agent_B), else `[[A]]` / `Winner: B` / `tie` markers.

    Raises:
        ValueError: no verdict in the reply.
    """
    for obj in json_objects(text):
        winner = str(obj.get("winner", "")).strip().lower().replace(" ", "_")
        if winner in _WINNER:
            return _WINNER[winner]
        scores = obj.get("combined_scores") or obj
        a = scores.get("score_a", scores.get("Agent_A")) if isinstance(scores, dict) else None
        b = scores.get("score_b", scores.get("Agent_B")) if isinstance(scores, dict) else None
        if isinstance(a, (int, float)) and isinstance(b, (int, float)):
            return 1.0 if a > b else 0.0 if a < b else 0.5
    match = (re.search(r"\[\[\s*(A|B|tie)\s*\]\]", text, re.I)
             or re.search(r"winner\W{0,5}(?:is\W{0,3})?(agent[ _]a|agent[ _]b|a|b|tie|draw)\b", text, re.I))
    if match:
        return _WINNER[match.group(1).lower().replace(" ", "_")]
    raise ValueError(f"no verdict in judge reply {text[:120]!r}")


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


# judge type -> builder `fn(cfg: JudgeConfig, reward_fn) -> judge`
JUDGES: Registry[Callable[..., Any]] = Registry("judge type")
register_judge = JUDGES.register


def build_judge(cfg: JudgeConfig, reward_fn: Any = None) -> Any:
    """The judge `cfg.type` names; `reward_fn` is the run's reward (used by `type: reward`)."""
    return JUDGES.lookup(cfg.type)(cfg, reward_fn)


class RewardComparator:
    """P(a beats b) from a pointwise reward: 1, 0 or 0.5 as a's reward is higher, lower or equal.

    Uses `Candidate.reward` when the candidate carries one, else scores the candidate's `reward_kwargs`
    through the run's `Scorer` (its executor, timeout, type checks and `on_error`). Symmetric by
    construction, so one call per match (no position bias to cancel).
    """

    def __init__(self, reward: Any):
        from rewards.scorer import Scorer

        self.scorer = Scorer.wrap(reward)
        self.stats = {"requests": 0}

    async def compare(self, query: str, a: Candidate, b: Candidate) -> float:
        ra, rb = await asyncio.gather(self._reward(a), self._reward(b))
        return 1.0 if ra > rb else 0.0 if ra < rb else 0.5

    async def _reward(self, c: Candidate) -> float:
        if c.reward is not None:
            return c.reward
        self.stats["requests"] += 1
        return await self.scorer.score_kwargs(**c.reward_kwargs)

    async def aclose(self) -> None:
        pass


@register_judge("reward")
def _build_reward_judge(cfg: JudgeConfig, reward_fn: Any) -> RewardComparator:
    if cfg.reward_function:
        from rewards.loader import load_reward
        from rewards.scorer import Scorer

        fn = load_reward(cfg.reward_function)
        # Another function, under the run's reward policy when there is one.
        return RewardComparator(reward_fn.sibling(fn) if isinstance(reward_fn, Scorer) else fn)
    if reward_fn is None:
        raise ValueError("judge type 'reward' needs a reward function")
    return RewardComparator(reward_fn)


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


@register_judge("llm")
def _build_llm_judge(cfg: JudgeConfig, reward_fn: Any) -> LLMJudge:
    return LLMJudge(cfg)


@register_judge("hf")
def _build_hf_judge(cfg: JudgeConfig, reward_fn: Any) -> Any:
    from rewards.hf_judge import HFJudge

    return HFJudge(cfg)


class LLMJudge(PairwiseModelJudge):
    """Pairwise judge over an OpenAI-compatible `/chat/completions` endpoint (see the module docstring)."""

    def __init__(self, cfg: JudgeConfig):
        super().__init__(cfg.prompt)
        if not cfg.model:
            raise ValueError("judge type 'llm' needs judge.model (the endpoint's model name)")
        self.cfg = cfg
        # The verdict cache of PairwiseModelJudge sits in front, so the client keeps none of its own.
        self.client = ChatClient(cfg.base_url, cfg.model, cfg.api_key_env, cfg.max_concurrency, cfg.max_retries,
                                 cfg.backoff_s, cfg.timeout_s, cfg.temperature, cfg.max_tokens, cache_size=0,
                                 stats=self.stats)

    async def judge_prompt(self, prompt: str) -> float:
        return await self.client.chat([{"role": "user", "content": prompt}], parse=parse_verdict)

    async def aclose(self) -> None:
        await self.client.aclose()
