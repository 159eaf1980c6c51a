"""Context policies: `step` makes each turn its own training sample, token-faithful where loss is."""
from pathlib import Path

import pytest

from envs import ToolEnv, get_parser
from rl_factory.chat import ChatFormat
from rl_factory.context import last_turns
from rl_factory.engines.base import SamplingParams
from rl_factory.engines.scripted import ScriptedEngine
from rl_factory.rollout import Agent, RolloutConfig

pytestmark = pytest.mark.anyio

CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "%s"}}\n</tool_call>'
MANIFEST = Path(__file__).resolve().parent.parent / "configs" / "tools" / "calculator.yaml"


def test_last_turns_keeps_system_task_and_last_k_turns():
    msgs = [{"role": "system", "content": "s"}, {"role": "user", "content": "task"}]
    for k in range(3):
        msgs += [{"role": "assistant", "content": f"a{k}"}, {"role": "tool", "content": f"t{k}"}]
    kept = last_turns(msgs, keep_turns=2)
    assert [m["content"] for m in kept] == ["s", "task", "a1", "t1", "a2", "t2"]
    assert last_turns(msgs, keep_turns=0) == msgs[:2]
    assert last_turns(msgs, keep_turns=5) == msgs


async def test_step_policy_makes_one_faithful_sample_per_turn(tokenizer):
    script = [CALL % "1 + 2", CALL % "3 * 4", "The answer is 12."]
    # One trajectory: the n-th generate call is turn n (step prompts are re-rendered, so they do not
    # extend each other the way the scripted engine's own turn detection expects).
    engine = ScriptedEngine(tokenizer, lambda ids, turn: script[len(engine.calls) - 1])
    async with ToolEnv.from_manifest(MANIFEST) as env:
        tools = await env.list_tools()
        fmt = ChatFormat(tokenizer, tools)
        cfg = RolloutConfig(max_turns=3, context="step", context_keep_turns=1)
        agent = Agent(engine, env, fmt, get_parser("hermes"), cfg)
        sample = {"messages": [{"role": "user", "content": "What is 3 * 4?"}]}
        traj = await agent.rollout(sample, 0, SamplingParams(0.0, 1.0, 64))
    assert traj.stop_reason == "answer" and len(traj.steps) == 3
    assert [r.text for r in traj.tool_results] == ["3", "12"]
    for step, prompt in zip(traj.steps, engine.calls):
        n = len(prompt)
        assert step.token_ids[:n] == prompt  # the prompt the engine was given ...
        assert step.loss_mask == [0] * n + [1] * (len(step.token_ids) - n)  # ... carries no loss
        generated = step.token_ids[n:]
        assert generated[-1] == tokenizer.eos_token_id and len(step.logprobs) == len(step.token_ids)
    # Turn 3's prompt is rendered from [task, last turn] only: the first call was cut by last_turns.
    third = tokenizer.decode(engine.calls[2])
    assert "1 + 2" not in third and "3 * 4" in third and "What is 3 * 4?" in third
    expected = fmt.prompt_ids(last_turns(traj.messages[:-1], keep_turns=1))
    assert engine.calls[2] == expected
    traj.advantage = 0.5
    assert [s.advantage for s in traj.training_samples()] == [0.5, 0.5, 0.5]
    # counted from the script, not from the steps' own masks
    expected_tokens = sum(len(tokenizer.encode(text, add_special_tokens=False)) + 1 for text in script)  # + eos
    assert traj.num_generated_tokens == expected_tokens
