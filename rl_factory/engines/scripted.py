"""A scripted engine for tests and benchmarks: plays back fixed assistant turns as token ids.

Where the model is beside the point (rollout mechanics, token faithfulness, tool-error paths,
scheduling benchmarks), a test scripts what the "model" says and how long it takes to say it. Each
call to `generate` returns the next scripted turn of the conversation it continues, with made-up
log-probs, so the test can check that the trajectory holds exactly these ids.
"""
from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

from rl_factory.engines.base import Generation, SamplingParams, register_engine

TurnOutput = str | Sequence[int]
Script = Sequence[TurnOutput] | Callable[[list[int], int], TurnOutput]
Delay = float | Callable[[list[int], int], float]


@register_engine("scripted")
class ScriptedEngine:
    """Args:
        tokenizer: turns scripted text into ids (the eos token appended); None when the script
            gives token ids.
        script: the assistant turns in order, each a text or a list of token ids (used verbatim:
            include the eos id for a turn that should end with "stop"), or a function
            `(prompt_ids, turn_index) -> text | ids`.
        delay_s: generation time of a turn in seconds, or a function `(prompt_ids, turn_index) ->
            seconds` (lets tests exercise concurrency and benchmarks model the engine).
        per_token_s: added generation time per returned token, so longer turns take longer.
        logprob: the log-prob reported for every generated token.
    """

    def __init__(self, tokenizer: Any = None, script: Script = (), delay_s: Delay = 0.0,
                 per_token_s: float = 0.0, logprob: float = -0.5):
        self.tokenizer = tokenizer
        self.script = script
        self.delay_s = delay_s
        self.per_token_s = per_token_s
        self.logprob = logprob
        self.calls: list[list[int]] = []  # every prompt it was asked to continue, for assertions
        self.busy_s: list[float] = []  # the generation time of each call, as scripted
        self._turn_of: dict[tuple[int, ...], int] = {}  # prompt -> turn index
        self._lengths: set[int] = set()  # lengths of the prompts in _turn_of

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> Generation:
        prompt_ids = list(prompt_ids)
        self.calls.append(prompt_ids)
        turn = self._turn_index(prompt_ids)
        ids = self._ids(self.script(prompt_ids, turn) if callable(self.script) else self.script[turn])
        finish = "stop"
        if len(ids) > params.max_new_tokens:
            ids, finish = ids[: params.max_new_tokens], "length"
        delay = self.delay_s(prompt_ids, turn) if callable(self.delay_s) else self.delay_s
        busy = delay + self.per_token_s * len(ids)
        self.busy_s.append(busy)
        if busy > 0:
            await asyncio.sleep(busy)
        return Generation(ids, [self.logprob] * len(ids), finish)

    def _ids(self, output: TurnOutput) -> list[int]:
        if not isinstance(output, str):
            return list(output)
        if self.tokenizer is None:
            raise ValueError("ScriptedEngine got a text turn but has no tokenizer; script token ids instead")
        return self.tokenizer.encode(output, add_special_tokens=False) + [self.tokenizer.eos_token_id]

    def _turn_index(self, prompt_ids: list[int]) -> int:
        # A later turn's prompt extends an earlier one of the same conversation: its turn index is
        # one more than that of the longest earlier, strictly shorter prompt it starts with.
        turn = 0
        for n in sorted((n for n in self._lengths if n < len(prompt_ids)), reverse=True):
            earlier = self._turn_of.get(tuple(prompt_ids[:n]))
            if earlier is not None:
                turn = earlier + 1
                break
        self._turn_of.setdefault(tuple(prompt_ids), turn)
        self._lengths.add(len(prompt_ids))
        return turn

    async def close(self) -> None:
        return None
