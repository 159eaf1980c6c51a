"""ChatFormat's rendered prompts: the n rollouts of a prompt render it once, and what they get is the render."""
from __future__ import annotations

from rl_factory import chat
from rl_factory.chat import ChatFormat

EXPRESSION = {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}
TOOLS = [{"type": "function", "function": {"name": "calculator", "description": "Evaluate an expression.",
                                           "parameters": EXPRESSION}}]


class CountingTokenizer:
    """The real tokenizer, counting its chat-template renders."""

    def __init__(self, tokenizer):
        self.inner, self.renders = tokenizer, 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def apply_chat_template(self, *args, **kwargs):
        self.renders += 1
        return self.inner.apply_chat_template(*args, **kwargs)


def test_a_prompt_is_rendered_once_for_its_rollouts_and_each_gets_its_own_ids(tokenizer, monkeypatch):
    counting = CountingTokenizer(tokenizer)
    fmt = ChatFormat(counting, TOOLS)
    prompt = [{"role": "user", "content": "What is 347 * 29?"}]
    expected = tokenizer.encode(tokenizer.apply_chat_template(prompt, tools=TOOLS, tokenize=False,
                                                              add_generation_prompt=True), add_special_tokens=False)
    before = counting.renders
    group = [fmt.prompt_ids([dict(m) for m in prompt]) for _ in range(8)]  # a GRPO group: equal, not the same, lists
    assert all(ids == expected for ids in group) and counting.renders == before + 1
    group[0].append(-1)  # a caller extending its ids does not change the next rollout's
    assert fmt.prompt_ids(prompt) == expected
    assert fmt.prompt_ids([{"role": "user", "content": "What is 348 * 29?"}]) != expected
    # the oldest prompts give way to the newest within the ids kept: a later render of one rebuilds the same ids
    monkeypatch.setattr(chat, "PROMPT_TOKENS_KEPT", 2 * len(expected) + 10)
    for k in range(3):
        fmt.prompt_ids([{"role": "user", "content": f"What is {k} * 29?"}])
    assert fmt._prompt_tokens <= chat.PROMPT_TOKENS_KEPT
    renders = counting.renders
    assert fmt.prompt_ids(prompt) == expected and counting.renders == renders + 1
    assert fmt.prompt_ids(prompt) == expected and counting.renders == renders + 1  # kept again


def test_a_prompt_that_is_not_json_is_rendered_each_time(tokenizer):
    counting = CountingTokenizer(tokenizer)
    fmt = ChatFormat(counting)
    prompt = [{"role": "user", "content": "hi", "seen_by": {"a", "b"}}]  # a key the template skips; json cannot
    before = counting.renders
    assert fmt.prompt_ids(prompt) == fmt.prompt_ids(prompt) and counting.renders == before + 2
