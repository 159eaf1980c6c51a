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
The candidate, the prompt, `JudgeConfig` and the both-ways verdict cache are `rewards.pairwise`'s, which
`rewards.hf_judge` builds on without importing this module.
"""
from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from typing import Any

from rewards.chat import ChatClient, json_objects
from rewards.pairwise import (  # noqa: F401  (their public home is here too)
    DEFAULT_PROMPT,
    NO_PATH,
    PLACEHOLDERS,
    Candidate,
    JudgeConfig,
    PairwiseModelJudge,
    final_answer,
    load_prompt,
    render_path,
    render_prompt,
)
from rl_factory.base.judging import JudgeError, PairwiseJudge  # noqa: F401  (JudgeError: public here too)
from rl_factory.base.registry import Registry


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


# judge type -> builder `fn(cfg: JudgeConfig, reward_fn) -> judge`
JUDGES: Registry[Callable[..., Any]] = Registry("judge type")
register_judge = JUDGES.register


def build_judge(cfg: JudgeConfig, reward_fn: Any = None) -> PairwiseJudge:
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
                                 stats=self.stats, extra_body=cfg.extra_body)

    async def judge_prompt(self, prompt: str) -> float:
        return await self.client.chat([{"role": "user", "content": prompt}], parse=parse_verdict)

    async def aclose(self) -> None:
        await self.client.aclose()
