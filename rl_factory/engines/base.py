"""The engine contract and its registry."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol

from rl_factory.registry import Registry


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one turn. `temperature == 0` means greedy."""

    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 256


@dataclass
class Generation:
    """One generated turn: exact token ids, their log-probs under the sampling policy, why it ended.

    `logprobs[i]` is log softmax(logits / temperature)[token_ids[i]] (temperature 1 when greedy):
    the same quantity the trainer recomputes, so PPO ratios start at 1 for on-policy data.
    `finish_reason` is "stop" (the eos token was generated and is included) or "length".
    """

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str


class Engine(Protocol):
    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> Generation: ...


ENGINES: Registry[Callable[..., Engine]] = Registry("engine")
register_engine = ENGINES.register
