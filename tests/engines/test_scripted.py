"""The scripted engine: turns as text or ids, per-conversation turn tracking, programmable time."""
import asyncio
import time

import pytest

from rl_factory.engines import ENGINES, SamplingParams
from rl_factory.engines.scripted import ScriptedEngine

pytestmark = pytest.mark.anyio

PARAMS = SamplingParams(temperature=1.0, max_new_tokens=8)


class CharTokenizer:
    """Just enough tokenizer: one id per character, eos 0."""

    eos_token_id = 0

    def encode(self, text, add_special_tokens=False):
        return [ord(c) for c in text]


async def test_registered_as_scripted():
    assert ENGINES["scripted"] is ScriptedEngine


async def test_turns_follow_each_conversation():
    """Two interleaved conversations each get their own next turn, found from the prompt alone."""
    engine = ScriptedEngine(None, lambda prompt, turn: [100 + prompt[0], turn, 7])
    a1 = await engine.generate([1], PARAMS)
    b1 = await engine.generate([2, 2], PARAMS)
    a2 = await engine.generate([1] + a1.token_ids + [50], PARAMS)
    b2 = await engine.generate([2, 2] + b1.token_ids + [50, 51], PARAMS)
    a3 = await engine.generate([1] + a1.token_ids + [50] + a2.token_ids + [60], PARAMS)
    again = await engine.generate([1], PARAMS)  # a new trajectory of the same prompt
    assert [g.token_ids[1] for g in (a1, b1, a2, b2, a3, again)] == [0, 0, 1, 1, 2, 0]
    assert a1.token_ids == [101, 0, 7] and a1.finish_reason == "stop" and a1.logprobs == [-0.5] * 3
    assert engine.calls[1] == [2, 2]


async def test_text_turns_need_a_tokenizer_and_are_cut_at_max_new_tokens():
    engine = ScriptedEngine(CharTokenizer(), ["hi", "a long answer"])
    first = await engine.generate([1], PARAMS)
    assert first.token_ids == [ord("h"), ord("i"), 0] and first.finish_reason == "stop"
    cut = await engine.generate([1] + first.token_ids, PARAMS)
    assert cut.token_ids == [ord(c) for c in "a long a"] and cut.finish_reason == "length"
    with pytest.raises(ValueError, match="no tokenizer"):
        await ScriptedEngine(None, ["text"]).generate([1], PARAMS)


async def test_generation_time_is_programmable():
    engine = ScriptedEngine(None, lambda prompt, turn: [9] * prompt[0],
                            delay_s=lambda prompt, turn: 0.01 * prompt[0], per_token_s=0.002)
    start = time.perf_counter()
    gens = await asyncio.gather(*(engine.generate([n], PARAMS) for n in (1, 2, 3)))
    elapsed = time.perf_counter() - start
    assert [len(g.token_ids) for g in gens] == [1, 2, 3]
    assert engine.busy_s == pytest.approx([0.012, 0.024, 0.036])
    assert 0.036 <= elapsed < 0.5  # concurrent calls overlap: about the longest, not the sum
    assert ScriptedEngine(None, [[1]], delay_s=0.25).busy_s == []  # nothing recorded before a call
