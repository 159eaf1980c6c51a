"""The engine contract and its registry."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol

import numpy as np

from rl_factory.base.registry import Registry


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one turn. `temperature == 0` means greedy.

    `seed` makes sampling reproducible: an engine that honours it (the embedded one does) draws the
    request's tokens from a stream of its own, so the same seed gives the same tokens whatever else
    is being generated at the time. The rollout derives one seed per trajectory and turn from the
    trainer's per-step seed (`derive_seed`); None = the engine's global generator.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 256
    seed: int | None = None
    # Admission order when requests wait for room in the engine's batch: lower first, then arrival. The
    # async trainer gives each batch its step, so an older batch's turns coming back from their tools go
    # before a newer batch's (its trainer waits for the older one); tokens never depend on it.
    priority: int = 0


def derive_seed(seed: int | None, *keys: int) -> int | None:
    """A child seed for `keys` (e.g. sample index, rollout, turn): well mixed, stable across runs."""
    if seed is None:
        return None
    return int(np.random.SeedSequence([k % (1 << 64) for k in (seed, *keys)]).generate_state(1, dtype=np.uint64)[0] >> 1)


@dataclass
class Generation:
    """One generated turn: exact token ids, their log-probs under the sampling policy, why it ended.

    `logprobs[i]` is log softmax(logits / temperature)[token_ids[i]] (temperature 1 when greedy):
    the same quantity the trainer recomputes, so PPO ratios start at 1 for on-policy data.
    `finish_reason` is "stop" (the eos token was generated and is included) or "length".
    `receipt` is the engine's own account of the turn for the run guard (rl_factory/guard/evidence.py):
    the digest of the ids it sampled, the policy version it last synced to and its weights' fingerprint.
    """

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    receipt: dict | None = None
    # [(policy version, tokens), ...] in order: which weights sampled which tokens. Only an engine whose
    # weights are swapped while it generates (async training, rl_factory/asynchrony.py) records it.
    version_spans: list[tuple[int, int]] | None = None


def version_spans(version: int | None, switches: list[tuple[int, int]], n: int) -> list[tuple[int, int]] | None:
    """[(version, tokens), ...] over `n` generated tokens that started under `version` and switched to the
    version of each (token index, version) of `switches`; None when versions are not tracked."""
    if version is None:
        return None
    spans, start = [], 0
    for index, new in [*switches, (n, None)]:
        index = min(index, n)
        if index > start:
            spans.append((version, index - start))
        start, version = max(start, index), new
    return spans


class Engine(Protocol):
    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> Generation: ...


ENGINES: Registry[Callable[..., Engine]] = Registry("engine")
register_engine = ENGINES.register
