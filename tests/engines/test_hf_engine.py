"""The embedded engine is reproducible whatever the batch, and reuses a trajectory's cache across turns.

A request's tokens and log-probs must be the same bits whether it decodes alone or among others
that arrive at other times, in other orders, with a batch too small to hold them all, and on one
or two torch threads: that is what makes two runs of the same seed identical although tool
latencies reorder the requests (tests/e2e/test_reproducible.py checks whole runs).
"""
import asyncio
import random

import pytest
import torch

from rl_factory.engines.base import SamplingParams
from rl_factory.engines.hf import HFEngine

pytestmark = pytest.mark.anyio

QUESTIONS = ["What is 3 + 4?", "What is 347 * 29?", "Please compute 1234 + 5678 for me, thanks.", "Hi",
             "What is 12 * 12 * 12?", "What is 9 - 10?",
             # long enough that prefills span several of the fused CPU attention's query blocks
             "Please add these numbers one after the other and tell me the total: " + " + ".join(map(str, range(40)))]


@pytest.fixture(scope="module")
def model(tiny_model_dir):
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()


@pytest.fixture
def threads(request):
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)


def prompt_ids(tokenizer, question: str) -> list[int]:
    text = tokenizer.apply_chat_template([{"role": "user", "content": question}], tokenize=False,
                                         add_generation_prompt=True)
    return tokenizer.encode(text, add_special_tokens=False)


def engine_for(model, tokenizer, **kwargs) -> HFEngine:
    return HFEngine(model, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, **kwargs)


async def generate_all(engine, prompts, params, delays):
    async def one(prompt, p, delay):
        await asyncio.sleep(delay)
        return await engine.generate(prompt, p)
    try:
        return await asyncio.gather(*(one(*args) for args in zip(prompts, params, delays)))
    finally:
        await engine.close()


@pytest.mark.parametrize("threads", [1, 2], indirect=True)
async def test_same_seed_same_bits_whatever_shares_the_batch(model, tokenizer, threads):
    prompts = [prompt_ids(tokenizer, q) for q in QUESTIONS]
    prompts.append(list(prompts[1]))  # a twin: the same prompt with another seed
    params = [SamplingParams(1.0, 1.0 if i % 3 else 0.9, 24, seed=100 + i) for i in range(len(prompts))]
    params[3] = SamplingParams(0.0, 1.0, 24)  # a greedy row in the mix

    alone = await generate_all(engine_for(model, tokenizer, threads=threads), prompts[:1], params[:1], [0.0])
    runs = []
    rng = random.Random(threads)
    for max_batch, wait in [(8, 0.0), (3, 0.0), (8, 0.05)]:
        delays = [rng.choice([0.0, 0.0, 0.003, 0.01, 0.03]) for _ in prompts]
        engine = engine_for(model, tokenizer, max_batch_size=max_batch, batch_wait_s=wait, admit_every=rng.choice([1, 4]),
                            threads=threads)
        runs.append(await generate_all(engine, prompts, params, delays))
        assert engine.stats["rows"] == len(prompts)

    assert runs[0][0].token_ids == alone[0].token_ids and runs[0][0].logprobs == alone[0].logprobs
    for run in runs[1:]:
        for got, want in zip(run, runs[0]):
            assert got.token_ids == want.token_ids
            assert got.logprobs == want.logprobs  # the same floats, not merely close
    first = runs[0]
    assert first[1].token_ids != first[-1].token_ids  # the twin sampled with its own seed


@pytest.mark.parametrize("threads", [2], indirect=True)
async def test_decoding_leaves_a_thread_to_the_event_loop_and_the_trainer_keeps_its_own(model, tokenizer, threads):
    """The decode thread's ops run on one thread fewer than the process's (a core stays free for the event
    loop and the tool servers); torch's setting is per thread, so the caller's forwards keep both."""
    seen = []
    # the LM head: the engine runs it after the trunk, a plain forward at its end
    hook = model.get_output_embeddings().register_forward_pre_hook(lambda *_: seen.append(torch.get_num_threads()))
    try:
        engine = engine_for(model, tokenizer)
        assert engine.threads == 1
        await generate_all(engine, [prompt_ids(tokenizer, QUESTIONS[0])], [SamplingParams(1.0, 1.0, 8, seed=1)], [0.0])
        assert seen and set(seen) == {1}
        seen.clear()
        with torch.no_grad():
            model(torch.tensor([prompt_ids(tokenizer, QUESTIONS[0])]))
        assert seen == [2] and torch.get_num_threads() == 2
        assert engine_for(model, tokenizer, threads=2).threads == 2  # rollout.engine_threads, given
    finally:
        hook.remove()


async def test_the_next_turn_prefills_only_the_observation(model, tokenizer):
    """Turn 2 (turn 1's ids + an observation) loads turn 1's cache: only the new ids are prefilled,
    and its log-probs still match a teacher-forced forward of the whole sequence. A weight update
    drops every kept cache."""
    prompt = prompt_ids(tokenizer, "What is 347 * 29?")
    probe = await generate_all(engine_for(model, tokenizer), [prompt], [SamplingParams(0.0, 1.0, 24)], [0.0])
    # The quick test model may ramble: let the 6th greedy token end the turn, so turn 1 surely stops.
    stop = probe[0].token_ids[5]
    engine = HFEngine(model, eos_token_id=stop, pad_token_id=tokenizer.pad_token_id)
    first = await engine.generate(prompt, SamplingParams(0.0, 1.0, 24))
    assert first.finish_reason == "stop" and first.token_ids[-1] == stop
    observation = tokenizer.encode("\n<|im_start|>user\n<tool_response>\n10063\n</tool_response><|im_end|>\n"
                                   "<|im_start|>assistant\n", add_special_tokens=False)
    second_prompt = prompt + first.token_ids + observation
    before = dict(engine.stats)
    second = await engine.generate(second_prompt, SamplingParams(1.0, 1.0, 16, seed=7))
    assert engine.stats["reused_tokens"] - before["reused_tokens"] == len(prompt) + len(first.token_ids) - 1
    assert engine.stats["prefill_tokens"] - before["prefill_tokens"] == len(observation) + 1  # + the stop token

    ids = torch.tensor([second_prompt + second.token_ids])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float()
    expected = torch.log_softmax(logits[len(second_prompt) - 1: -1], -1).gather(
        -1, torch.tensor(second.token_ids)[:, None]).squeeze(-1)
    torch.testing.assert_close(torch.tensor(second.logprobs), expected, atol=1e-4, rtol=0)

    # An optimizer step (any in-place change of a parameter) makes every kept cache stale.
    await engine.generate(prompt, SamplingParams(0.0, 1.0, 24))
    with torch.no_grad():
        next(model.parameters()).mul_(1.0)
    before = dict(engine.stats)
    await engine.generate(second_prompt, SamplingParams(0.0, 1.0, 4))
    await engine.close()
    assert engine.stats["reused_tokens"] == before["reused_tokens"]
    assert engine.stats["prefill_tokens"] - before["prefill_tokens"] == len(second_prompt)


async def test_slots_are_allocated_once_at_full_size_and_change_no_bits(model, tokenizer):
    """With `max_context` (the rollout's token budget) the key/value slots are made whole at the first
    forward, `max_batch_size` rows by max_context positions, and never grow mid-rollout; without it they
    grow by doubling, in rows never past the batch. Either way a request gets the same bits: storage
    capacity is not part of what a row computes."""
    prompts = [prompt_ids(tokenizer, q) for q in QUESTIONS]
    params = [SamplingParams(1.0, 1.0, 40, seed=200 + i) for i in range(len(prompts))]
    delays = [0.0, 0.01, 0.0, 0.02, 0.0, 0.005, 0.0]

    whole = engine_for(model, tokenizer, max_batch_size=4, max_context=256, threads=1)  # min_rows(): 16
    got = await generate_all(whole, prompts, params, delays)
    kv = whole.kv_slots
    assert kv.allocations == 1  # the first forward, nothing after
    assert kv.keys[0].shape[0] == 16 and kv.keys[0].shape[2] == 256  # max(max_batch_size, min_rows) rows

    grown = engine_for(model, tokenizer, max_batch_size=4, threads=1)
    want = await generate_all(grown, prompts, params, delays)
    assert grown.kv_slots.allocations > 1 and grown.kv_slots.keys[0].shape[0] <= 16
    for a, b in zip(got, want):
        assert a.token_ids == b.token_ids and a.logprobs == b.logprobs

    # slots bigger than the budget grow on demand instead
    capped = engine_for(model, tokenizer, max_batch_size=4, max_context=256, kv_prealloc_bytes=1024, threads=1)
    await generate_all(capped, prompts[:2], params[:2], [0.0, 0.0])
    assert capped.kv_slots.keys[0].shape[2] < 256


async def test_a_join_prefills_runs_of_similar_length_with_the_same_bits(model, tokenizer):
    """Requests admitted together are prefilled shortest first in runs of similar length, each padded to its
    own longest (not all to the longest prompt), and a request gets the same bits as when it arrives alone."""
    prompts = [prompt_ids(tokenizer, q) for q in QUESTIONS]  # 11-159 tokens: one long prompt among short ones
    params = [SamplingParams(1.0, 1.0, 6, seed=300 + i) for i in range(len(prompts))]
    # a generous wait: all seven requests are in the inbox before the decode thread admits any (one join)
    together = engine_for(model, tokenizer, max_batch_size=8, batch_wait_s=0.5, threads=1)
    got = await generate_all(together, prompts, params, [0.0] * len(prompts))
    stats = together.stats
    assert stats["batches"] == 1 and stats["prefill_forwards"] >= 2
    real = sum(len(p) for p in prompts)
    assert stats["prefill_tokens"] == real
    assert stats["prefill_padded_tokens"] < 1.5 * real < len(prompts) * max(len(p) for p in prompts) / 2

    for prompt, p, want in zip(prompts, params, got):
        alone = await generate_all(engine_for(model, tokenizer, threads=1), [prompt], [p], [0.0])
        assert alone[0].token_ids == want.token_ids and alone[0].logprobs == want.logprobs
