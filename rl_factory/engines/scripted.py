"""A scripted engine for tests: plays back fixed assistant turns as token ids.

Where the model is beside the point (rollout mechanics, token faithfulness, tool-error paths), a
test scripts what the "model" says. Each call to `generate` returns the next scripted turn of the
conversation it continues, tokenized once, with made-up log-probs, so the test can check that the
trajectory holds exactly these ids.
"""
from __future__ import annotations

import asyncio
from typing import Callable

from rl_factory.engines.base import Generation, SamplingParams, register_engine


@register_engine("scripted")
class ScriptedEngine:
    """Args:
        tokenizer: used once per turn to turn the scripted text into ids (eos appended).
        script: a list of assistant turn texts, or a function `(prompt_ids, turn_index) -> text`.
        delay_s: simulated generation latency per turn (lets tests exercise concurrency).
    """

    def __init__(self, tokenizer, script: list[str] | Callable[[list[int], int], str], delay_s: float = 0.0):
        self.tokenizer = tokenizer
        self.script = script
        self.delay_s = delay_s
        self.calls: list[list[int]] = []  # every prompt it was asked to continue, for assertions
        self._turns: dict[int, int] = {}  # call number -> turn index

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> Generation:
        self.calls.append(list(prompt_ids))
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        turn = self._turn_index(prompt_ids)
        text = self.script(prompt_ids, turn) if callable(self.script) else self.script[turn]
        ids = self.tokenizer.encode(text, add_special_tokens=False) + [self.tokenizer.eos_token_id]
        finish = "stop"
        if len(ids) > params.max_new_tokens:
            ids, finish = ids[: params.max_new_tokens], "length"
        return Generation(ids, [-0.5] * len(ids), finish)

    def _turn_index(self, prompt_ids: list[int]) -> int:
        # A later turn's prompt extends an earlier one of the same conversation: its turn index is
        # one more than that of the longest earlier prompt it starts with.
        earlier = [n for n, ids in enumerate(self.calls[:-1]) if prompt_ids[: len(ids)] == ids and len(ids) < len(prompt_ids)]
        turn = 0 if not earlier else self._turns[max(earlier, key=lambda n: len(self.calls[n]))] + 1
        self._turns[len(self.calls) - 1] = turn
        return turn

    async def close(self) -> None:
        return None
