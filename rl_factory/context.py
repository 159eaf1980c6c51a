"""Context policies: how a trajectory's next prompt is built, and what becomes a training sample.

- `append` (default): one token sequence per trajectory. The prompt is rendered once; generated ids
  and tool-observation ids are appended by id, so the whole trajectory is one token-faithful sample.
- `step` (Agent-R1's step-level MDP): every turn is its own training sample with its own prompt,
  rendered from the (processed) message history. A context processor may truncate, summarize or
  rewrite the history between turns, since prompt tokens carry no loss; the generated tokens of
  each step are still exactly the engine's. The trajectory's advantage applies to every step.

Context processors (`CONTEXT_PROCESSORS`) map the message history to the messages the next prompt
is rendered from; `last_turns` keeps the system prompt, the task and the last K turns.
"""
from __future__ import annotations

from typing import Callable

from rl_factory.chat import ChatFormat
from rl_factory.engines.base import Generation
from rl_factory.base.registry import Registry
from rl_factory.base.types import Step

CONTEXT_POLICIES: Registry[type] = Registry("context policy")
CONTEXT_PROCESSORS: Registry[Callable[..., list[dict]]] = Registry("context processor")
register_context_policy, get_context_policy = CONTEXT_POLICIES.register, CONTEXT_POLICIES.lookup
register_context_processor = CONTEXT_PROCESSORS.register


@register_context_processor("full")
def full_history(messages: list[dict], **_) -> list[dict]:
    return messages


@register_context_processor("last_turns")
def last_turns(messages: list[dict], keep_turns: int = 2, **_) -> list[dict]:
    """System prompt(s) and the task (everything before the first assistant turn), plus the last
    `keep_turns` turns (an assistant message with the tool messages that answer it)."""
    first = next((i for i, m in enumerate(messages) if m["role"] == "assistant"), len(messages))
    head, rest = messages[:first], messages[first:]
    starts = [i for i, m in enumerate(rest) if m["role"] == "assistant"]
    cut = starts[-keep_turns] if keep_turns > 0 and len(starts) >= keep_turns else (len(rest) if keep_turns <= 0 else 0)
    return head + rest[cut:]


@register_context_policy("append")
class AppendContext:
    """One growing token sequence: prompt, then generated ids (mask 1) and observation ids (mask 0)."""

    def __init__(self, fmt: ChatFormat, messages: list[dict], max_total_tokens: int,
                 max_tail_tokens: int | None = None, **_):
        self.fmt = fmt
        self.prompt_ids = fmt.prompt_ids(messages)
        # the whole sequence, and the part after the prompt, each within its budget
        tail_cap = len(self.prompt_ids) + max_tail_tokens if max_tail_tokens is not None else max_total_tokens
        self.max_total_tokens = min(max_total_tokens, tail_cap)
        self.ids, self.mask, self.logprobs = list(self.prompt_ids), [0] * len(self.prompt_ids), [0.0] * len(self.prompt_ids)
        self.steps: list[Step] = []

    def next_prompt(self, messages: list[dict]) -> list[int]:
        return self.ids

    def budget(self) -> int:
        return self.max_total_tokens - len(self.ids)

    def add_generation(self, gen: Generation) -> None:
        self.ids += gen.token_ids
        self.mask += [1] * len(gen.token_ids)
        self.logprobs += gen.logprobs

    def add_observation(self, tool_messages: list[dict]) -> list[int] | None:
        """Append the tool turn's ids; None when they would overflow the token budget."""
        obs = self.fmt.observation_ids(tool_messages)
        if len(self.ids) + len(obs) >= self.max_total_tokens:
            return None
        self.ids += obs
        self.mask += [0] * len(obs)
        self.logprobs += [0.0] * len(obs)
        return obs


@register_context_policy("step")
class StepContext:
    """A fresh prompt per turn from the processed history; each turn becomes one `Step` sample."""

    def __init__(self, fmt: ChatFormat, messages: list[dict], max_total_tokens: int,
                 max_tail_tokens: int | None = None, processor: str = "last_turns", keep_turns: int = 2, **_):
        CONTEXT_PROCESSORS.lookup(processor)  # an unknown name fails here, listing the valid ones
        self.fmt, self.max_total_tokens, self.max_tail_tokens = fmt, max_total_tokens, max_tail_tokens
        self.process = lambda msgs: CONTEXT_PROCESSORS[processor](msgs, keep_turns=keep_turns)
        self.prompt_ids = fmt.prompt_ids(messages)
        self.current = self.prompt_ids
        self.steps: list[Step] = []

    def next_prompt(self, messages: list[dict]) -> list[int]:
        self.current = self.prompt_ids if len(messages) == 0 else self.fmt.prompt_ids(self.process(messages))
        return self.current

    def budget(self) -> int:
        left = self.max_total_tokens - len(self.current)
        # a step's tail is its one generated turn
        return left if self.max_tail_tokens is None else min(left, self.max_tail_tokens)

    def add_generation(self, gen: Generation) -> None:
        n = len(self.current)
        self.steps.append(Step(self.current + gen.token_ids, [0] * n + [1] * len(gen.token_ids),
                               [0.0] * n + list(gen.logprobs)))

    def add_observation(self, tool_messages: list[dict]) -> list[int] | None:
        return []  # nothing is appended: the next prompt is rendered from the messages

    @property
    def ids(self) -> list[int]:
        return self.steps[-1].token_ids if self.steps else list(self.prompt_ids)

    @property
    def mask(self) -> list[int]:
        return self.steps[-1].loss_mask if self.steps else [0] * len(self.prompt_ids)

    @property
    def logprobs(self) -> list[float]:
        return self.steps[-1].logprobs if self.steps else [0.0] * len(self.prompt_ids)
