"""Judges without a model: verdict parsing, prompt rendering, the reward comparator, the registry."""
import asyncio

import pytest

from rewards.judge import (DEFAULT_PROMPT, Candidate, JudgeConfig, RewardComparator, build_judge, final_answer,
                           load_prompt, parse_verdict, render_path, render_prompt)

MESSAGES = [
    {"role": "user", "content": "What is 347 * 29?"},
    {"role": "assistant", "content": "Let me compute.",
     "tool_calls": [{"type": "function", "function": {"name": "calculator", "arguments": {"expression": "347*29"}}}]},
    {"role": "tool", "content": "10063"},
    {"role": "assistant", "content": "The answer is 10063."},
]


@pytest.mark.parametrize("reply, verdict", [
    ('{"reason": "A used the tool", "score_a": 8, "score_b": 3, "winner": "A"}', 1.0),
    ('Sure!\n```json\n{"winner": "B"}\n```', 0.0),
    ('{"winner": "tie"}', 0.5),
    ('{"winner": "Agent_B", "combined_scores": {"Agent_A": 9, "Agent_B": 4}}', 0.0),
    ('{"combined_scores": {"Agent_A": 7.5, "Agent_B": 4.0}}', 1.0),  # the reference's format
    ('{"score_a": 5, "score_b": 5}', 0.5),
    ("My final verdict is [[B]].", 0.0),
    ("Winner: A", 1.0),
    ("The winner is agent A, clearly.", 1.0),
    ('{"reason": "braces { inside } text", "winner": "a"}', 1.0),
])
def test_parse_verdict(reply, verdict):
    assert parse_verdict(reply) == verdict


@pytest.mark.parametrize("reply", ["", "I cannot decide.", '{"winner": "C"}', '{"score_a": "high"}', "Abba Babba"])
def test_parse_verdict_rejects_garbage(reply):
    with pytest.raises(ValueError, match="no verdict"):
        parse_verdict(reply)


def test_default_prompt_shows_path_and_answer():
    a = Candidate(answer=final_answer(MESSAGES), path=render_path(MESSAGES))
    b = Candidate(answer="It is 10000.")
    prompt = render_prompt(DEFAULT_PROMPT, "What is 347 * 29?", a, b)
    assert 'call calculator({"expression": "347*29"})' in prompt and "Step 1: Let me compute." in prompt
    assert "The answer is 10063." in prompt and "It is 10000." in prompt
    assert "10063\n" not in prompt.split("[AGENT A: FINAL ANSWER]")[0]  # tool outputs are not shown
    assert "(no tool calls)" in prompt  # b's empty path
    assert '"winner": "A" | "B" | "tie"' in prompt  # JSON braces survive rendering


def test_prompt_from_file_or_inline(tmp_path):
    path = tmp_path / "prompt.txt"
    path.write_text("Q {query}\nA {answer_a}\nB {answer_b}\n{not_a_placeholder}")
    text = load_prompt(str(path))
    assert render_prompt(text, "q", Candidate("x"), Candidate("y")) == "Q q\nA x\nB y\n{not_a_placeholder}"
    assert load_prompt("{answer_a} vs {answer_b}") == "{answer_a} vs {answer_b}"
    assert load_prompt(None) == DEFAULT_PROMPT
    with pytest.raises(ValueError, match="neither a file nor a template"):
        load_prompt("prompts/missing.txt")


def test_reward_comparator_uses_known_rewards_or_calls_the_function():
    calls = []

    def reward(completion, answer, **_):
        calls.append(completion)
        return 1.0 if completion.strip() == answer else 0.0

    judge = build_judge(JudgeConfig(type="reward"), reward_fn=reward)
    assert isinstance(judge, RewardComparator)
    good = Candidate("4", reward_kwargs={"completion": "4", "answer": "4"})
    bad = Candidate("5", reward_kwargs={"completion": "5", "answer": "4"})
    assert asyncio.run(judge.compare("2+2?", good, bad)) == 1.0
    assert asyncio.run(judge.compare("2+2?", bad, good)) == 0.0
    assert asyncio.run(judge.compare("2+2?", good, good)) == 0.5
    assert len(calls) == 6
    known = Candidate("x", reward=0.3)
    assert asyncio.run(judge.compare("", known, Candidate("y", reward=0.7))) == 0.0 and len(calls) == 6


def test_judge_registry_and_config_errors():
    with pytest.raises(KeyError, match="unknown judge type 'gpt'; valid: .*'llm'.*'reward'"):
        build_judge(JudgeConfig(type="gpt"))
    with pytest.raises(ValueError, match="needs judge.model"):
        build_judge(JudgeConfig(type="llm"))
    with pytest.raises(ValueError, match="needs judge.model_path"):
        build_judge(JudgeConfig(type="hf"))
    with pytest.raises(ValueError, match="needs a reward function"):
        build_judge(JudgeConfig(type="reward"))
