"""The multi-turn rollout is token-faithful (DESIGN §4), and the HF engine's log-probs are exact.

Rollout tests script the "model" with `ScriptedEngine` and call the real calculator MCP server
through `ToolEnv`, with the real tokenizer and chat template of the tiny embedded model. Expected
token ids are built independently of `ChatFormat` (from `apply_chat_template` and literal
template text), so a bug in the observation delta or in the token bookkeeping cannot hide.
"""
import asyncio
from pathlib import Path

import pytest
import torch

from envs import ToolEnv, get_parser
from rl_factory.chat import ChatFormat
from rl_factory.engines.base import Generation, SamplingParams
from rl_factory.engines.hf import HFEngine
from rl_factory.engines.scripted import ScriptedEngine
from rl_factory.rollout import TRUNCATION_MARKER, Agent, RolloutConfig

pytestmark = pytest.mark.anyio

CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "347 * 29"}}\n</tool_call>'
ANSWER = "The answer is 10063."
QUESTION = [{"role": "user", "content": "What is 347 * 29?"}]
OBSERVATION = "\n<|im_start|>user\n<tool_response>\n10063\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
CALCULATOR_MANIFEST = Path(__file__).resolve().parent.parent / "configs" / "tools" / "calculator.yaml"
GREEDY = SamplingParams(temperature=0.0, max_new_tokens=64)


@pytest.fixture(scope="module")
async def env():
    async with ToolEnv.from_manifest(CALCULATOR_MANIFEST) as tool_env:
        await tool_env.list_tools()  # servers start lazily; the tests read env.tools
        yield tool_env


class RecordingEngine:
    """A ScriptedEngine that remembers what it returned and gives every token a distinct log-prob
    (the scripted engine's constant -0.5 could not show a misaligned log-prob)."""

    def __init__(self, tokenizer, script):
        self.inner = ScriptedEngine(tokenizer, script)
        self.returned: list[Generation] = []
        self.params: list[SamplingParams] = []

    @property
    def calls(self) -> list[list[int]]:
        return self.inner.calls

    async def generate(self, prompt_ids, params):
        gen = await self.inner.generate(prompt_ids, params)
        first = sum(len(g.token_ids) for g in self.returned)
        gen = Generation(gen.token_ids, [-(first + k + 1) / 1000 for k in range(len(gen.token_ids))],
                         gen.finish_reason)
        self.returned.append(gen)
        self.params.append(params)
        return gen


def make_agent(tokenizer, env, script, **cfg):
    engine = RecordingEngine(tokenizer, script)
    fmt = ChatFormat(tokenizer, env.tools)
    config = RolloutConfig(**{"max_turns": 3, "max_response_tokens": 64, "max_total_tokens": 512,
                              "max_tool_response_tokens": 128, **cfg})
    return Agent(engine, env, fmt, get_parser("hermes"), config), engine


def encode(tokenizer, text):
    return tokenizer.encode(text, add_special_tokens=False)


def prompt_ids(tokenizer, env, messages=QUESTION):
    text = tokenizer.apply_chat_template(messages, tools=env.tools, tokenize=False, add_generation_prompt=True)
    return encode(tokenizer, text)


async def test_two_turn_rollout_is_token_faithful(tokenizer, env):
    agent, engine = make_agent(tokenizer, env, [CALL, ANSWER])
    traj = await agent.rollout({"messages": QUESTION, "answer": "10063"}, 0, GREEDY)

    prompt = prompt_ids(tokenizer, env)
    turn1, turn2 = (g.token_ids for g in engine.returned)
    observation = encode(tokenizer, OBSERVATION)
    eos = tokenizer.eos_token_id
    assert turn1[-1] == eos and turn2[-1] == eos and eos not in turn1[:-1] + turn2[:-1]
    assert traj.prompt_ids == prompt
    assert traj.token_ids == prompt + turn1 + observation + turn2
    assert traj.loss_mask == [0] * len(prompt) + [1] * len(turn1) + [0] * len(observation) + [1] * len(turn2)
    lp1, lp2 = (g.logprobs for g in engine.returned)
    assert traj.logprobs == [0.0] * len(prompt) + lp1 + [0.0] * len(observation) + lp2
    assert len(traj.token_ids) == len(traj.loss_mask) == len(traj.logprobs)
    assert traj.num_generated_tokens == len(turn1) + len(turn2)

    # Later prompts are built by appending ids, never by re-rendering the history.
    assert engine.calls == [prompt, prompt + turn1 + observation]
    assert [t.generated_ids for t in traj.turns] == [turn1, turn2]
    assert traj.turns[0].observation_ids == observation and traj.turns[1].observation_ids == []

    assert traj.stop_reason == "answer"
    assert traj.completion == ANSWER
    (call,) = traj.tool_calls
    assert (call.name, call.arguments, call.error) == ("calculator", {"expression": "347 * 29"}, None)
    (result,) = traj.tool_results
    assert result.ok and result.text == "10063"
    assert traj.messages == QUESTION + [
        {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "calculator", "arguments": {"expression": "347 * 29"}}}]},
        {"role": "tool", "content": "10063"},
        {"role": "assistant", "content": ANSWER},
    ]

    # The trained sequence reads exactly as the chat template renders the final conversation, except
    # for the glue the template writes after the last <|im_end|>, which the model never generates.
    rendered = tokenizer.apply_chat_template(traj.messages, tools=env.tools, tokenize=False)
    decoded = tokenizer.decode(traj.token_ids, skip_special_tokens=False)
    assert rendered.endswith("<|im_end|>\n") and decoded.endswith("<|im_end|>")
    assert decoded + "\n" == rendered


async def test_tool_call_on_the_last_turn_is_not_executed(tokenizer, env):
    agent, engine = make_agent(tokenizer, env, [CALL, CALL], max_turns=2)
    env.reset_metrics()
    traj = await agent.rollout({"messages": QUESTION}, 0, GREEDY)
    assert env.metrics()["tool/calls"] == 1  # the first turn's call only
    assert traj.stop_reason == "max_turns"
    assert len(traj.turns) == 2 and len(engine.calls) == 2
    assert len(traj.turns[0].tool_results) == 1 and traj.turns[1].tool_results == []
    assert traj.turns[1].observation_ids == []
    turn1, turn2 = (g.token_ids for g in engine.returned)
    prompt = prompt_ids(tokenizer, env)
    assert traj.token_ids == prompt + turn1 + encode(tokenizer, OBSERVATION) + turn2
    assert traj.messages[-1]["role"] == "assistant" and traj.messages[-1]["tool_calls"]

    agent, engine = make_agent(tokenizer, env, [CALL], max_turns=1)
    traj = await agent.rollout({"messages": QUESTION}, 0, GREEDY)
    assert traj.stop_reason == "max_turns" and traj.tool_results == []
    assert traj.token_ids == prompt + engine.returned[0].token_ids
    assert env.metrics()["tool/calls"] == 1


async def test_total_token_budget_stops_the_rollout(tokenizer, env):
    prompt = prompt_ids(tokenizer, env)
    observation = encode(tokenizer, OBSERVATION)
    turn1 = encode(tokenizer, CALL) + [tokenizer.eos_token_id]
    turn2 = encode(tokenizer, ANSWER) + [tokenizer.eos_token_id]

    # Room for 3 tokens of the second turn: it is cut, and the cut turn ends the trajectory.
    budget = len(prompt) + len(turn1) + len(observation) + 3
    agent, engine = make_agent(tokenizer, env, [CALL, ANSWER], max_total_tokens=budget)
    traj = await agent.rollout({"messages": QUESTION}, 0, GREEDY)
    assert engine.params[1].max_new_tokens == 3
    assert traj.stop_reason == "max_tokens"
    assert traj.token_ids == prompt + turn1 + observation + turn2[:3]
    assert len(traj.token_ids) == budget

    # The observation itself does not fit: it is not appended, and no further turn is generated.
    agent, engine = make_agent(tokenizer, env, [CALL, ANSWER],
                               max_total_tokens=len(prompt) + len(turn1) + len(observation))
    traj = await agent.rollout({"messages": QUESTION}, 0, GREEDY)
    assert traj.stop_reason == "max_tokens" and len(engine.calls) == 1
    assert traj.token_ids == prompt + turn1 and traj.loss_mask == [0] * len(prompt) + [1] * len(turn1)

    # The prompt alone fills the budget: nothing is generated.
    agent, engine = make_agent(tokenizer, env, [ANSWER], max_total_tokens=len(prompt))
    traj = await agent.rollout({"messages": QUESTION}, 0, GREEDY)
    assert traj.stop_reason == "max_tokens" and engine.calls == [] and traj.token_ids == prompt

    # A cap on the tail after the prompt (verl's response_length) binds like the total budget does.
    agent, engine = make_agent(tokenizer, env, [CALL, ANSWER], max_total_tokens=4096,
                               max_tail_tokens=len(turn1) + len(observation) + 3)
    traj = await agent.rollout({"messages": QUESTION}, 0, GREEDY)
    assert engine.params[1].max_new_tokens == 3
    assert traj.stop_reason == "max_tokens" and traj.token_ids == prompt + turn1 + observation + turn2[:3]

    # The per-turn limit applies too: a turn cut by max_response_tokens is "max_tokens", not an answer.
    agent, engine = make_agent(tokenizer, env, [ANSWER], max_response_tokens=2)
    traj = await agent.rollout({"messages": QUESTION}, 0, GREEDY)
    assert traj.stop_reason == "max_tokens" and traj.token_ids == prompt + turn2[:2]


async def test_malformed_and_unknown_tool_calls_become_tool_messages(tokenizer, env):
    bad = '<tool_call>\n{"name": "calculator", "arguments": {"expression": 347 *}}\n</tool_call>'
    unknown = '<tool_call>\n{"name": "weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    agent, engine = make_agent(tokenizer, env, [bad + "\n" + unknown, ANSWER])
    traj = await agent.rollout({"messages": QUESTION}, 0, GREEDY)
    assert traj.stop_reason == "answer" and len(traj.turns) == 2  # the rollout went on
    parse_error, unknown_tool = traj.tool_results
    assert parse_error.error_kind == "parse" and parse_error.call.error
    assert unknown_tool.error_kind == "unknown_tool"
    tool_messages = [m for m in traj.messages if m["role"] == "tool"]
    assert [m["content"] for m in tool_messages] == [parse_error.text, unknown_tool.text]
    assert tool_messages[0]["content"].startswith("Error") and "invalid JSON" in tool_messages[0]["content"]
    assert tool_messages[1]["content"].startswith("Error") and "unknown tool 'weather'" in tool_messages[1]["content"]
    assert "calculator" in tool_messages[1]["content"]  # names the tools that do exist
    # Both error texts reach the model, as one user turn of two <tool_response> blocks.
    observation = encode(tokenizer, "\n<|im_start|>user\n<tool_response>\n" + parse_error.text
                         + "\n</tool_response>\n<tool_response>\n" + unknown_tool.text
                         + "\n</tool_response><|im_end|>\n<|im_start|>assistant\n")
    turn1, turn2 = (g.token_ids for g in engine.returned)
    assert traj.token_ids == prompt_ids(tokenizer, env) + turn1 + observation + turn2


async def test_long_tool_response_is_truncated_with_a_marker(tokenizer, env):
    call = CALL.replace("347 * 29", "123456789 * 987654321")  # 121932631112635269: a token per digit
    agent, engine = make_agent(tokenizer, env, [call, ANSWER], max_tool_response_tokens=4)
    traj = await agent.rollout({"messages": QUESTION}, 0, GREEDY)
    (result,) = traj.tool_results
    assert result.ok and result.text == "121932631112635269"  # the full result is kept for rewards
    tool_message = next(m for m in traj.messages if m["role"] == "tool")
    assert tool_message["content"] == "1219" + TRUNCATION_MARKER
    observation = encode(tokenizer, OBSERVATION.replace("10063", "1219" + TRUNCATION_MARKER))
    assert traj.turns[0].observation_ids == observation
    assert traj.stop_reason == "answer"


# ---- the embedded engine ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_model(tiny_model_dir):
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()


def teacher_forced_logprobs(model, prompt, generated, temperature):
    ids = torch.tensor([prompt + generated])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float()
    logits = logits / temperature if temperature > 0 else logits
    logprobs = torch.log_softmax(logits[len(prompt) - 1: -1], dim=-1)
    return logprobs, logprobs.gather(-1, torch.tensor(generated)[:, None]).squeeze(-1)


@pytest.mark.parametrize("temperature", [1.0, 0.0], ids=["sampled", "greedy"])
async def test_hf_engine_logprobs_match_a_teacher_forced_forward(tokenizer, tiny_model, temperature):
    """Four prompts of different lengths decoded in ONE left-padded batch: every row's tokens and
    log-probs must be what the model gives that row alone, unpadded."""
    torch.manual_seed(0)
    questions = ["What is 3 + 4?", "What is 347 * 29?", "Please compute 1234 + 5678 for me, thanks.",
                 "Hi"]
    prompts = [encode(tokenizer, tokenizer.apply_chat_template([{"role": "user", "content": q}], tokenize=False,
                                                               add_generation_prompt=True)) for q in questions]
    prompts[3] = prompts[3][:3]  # very short
    assert len({len(p) for p in prompts}) == 4
    engine = HFEngine(tiny_model, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                      max_batch_size=8, batch_wait_s=0.05)
    limits = [12, 8, 16, 10]  # per-row token budgets inside one batch
    try:
        gens = await asyncio.gather(*(engine.generate(p, SamplingParams(temperature, 1.0, n))
                                      for p, n in zip(prompts, limits)))
    finally:
        await engine.close()
    assert (engine.stats["batches"], engine.stats["rows"]) == (1, 4)
    for prompt, gen, limit in zip(prompts, gens, limits):
        assert 0 < len(gen.token_ids) <= limit and len(gen.logprobs) == len(gen.token_ids)
        eos_at = [i for i, t in enumerate(gen.token_ids) if t == tokenizer.eos_token_id]
        assert eos_at in ([], [len(gen.token_ids) - 1])  # generation stops right after eos
        assert gen.finish_reason == ("stop" if eos_at else "length")
        if not eos_at:
            assert len(gen.token_ids) == limit
        full, picked = teacher_forced_logprobs(tiny_model, prompt, gen.token_ids, temperature)
        torch.testing.assert_close(torch.tensor(gen.logprobs), picked, atol=1e-4, rtol=0)
        if temperature == 0:
            assert gen.token_ids == full.argmax(-1).tolist()


async def test_hf_engine_requests_join_a_running_batch(tokenizer, tiny_model):
    """Continuous batching: requests that arrive while others decode join the running batch (their
    caches merged, left-padded) instead of waiting; every row still matches a teacher-forced forward,
    and rows with different temperatures share the batch."""
    torch.manual_seed(1)
    questions = ["What is 3 + 4?", "What is 347 * 29?", "Please compute 1234 + 5678 for me, thanks.", "Hi there"]
    prompts = [encode(tokenizer, tokenizer.apply_chat_template([{"role": "user", "content": q}], tokenize=False,
                                                               add_generation_prompt=True)) for q in questions]
    engine = HFEngine(tiny_model, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                      max_batch_size=8, batch_wait_s=0.0)
    temps = [1.0, 0.0, 1.0, 0.0]

    async def late(i: int, delay: float):
        await asyncio.sleep(delay)
        return await engine.generate(prompts[i], SamplingParams(temps[i], 1.0, 40))

    try:
        gens = await asyncio.gather(late(0, 0.0), late(1, 0.0), late(2, 0.02), late(3, 0.04))
    finally:
        await engine.close()
    assert engine.stats["rows"] == 4 and engine.stats["batches"] >= 2
    assert engine.max_rows >= 3  # a later row ran in the same forward as an earlier, unfinished one
    for prompt, gen, temperature in zip(prompts, gens, temps):
        full, picked = teacher_forced_logprobs(tiny_model, prompt, gen.token_ids, temperature)
        torch.testing.assert_close(torch.tensor(gen.logprobs), picked, atol=1e-4, rtol=0)
        if temperature == 0:
            assert gen.token_ids == full.argmax(-1).tolist()
