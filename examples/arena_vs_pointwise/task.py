"""The hidden quality of a calculator answer: how close its number is to the true result.

The task is the embedded default's (examples/calculator: "What is 876 * 530?", one calculator call
solves it), with a graded quality instead of exact match, so that a judge has something to compress:

- 1.0 for the exact result;
- else 0.5 * max(0, 1 - |answer - result| / |result|): a wrong number scores by its relative error
  (at most 0.5, so every exact answer beats every wrong one);
- 0.0 without a number.

The optimum is computed from the question itself (`optimum`), so the stand-in judge
(judge_server.py) scores what the model wrote without seeing the dataset. `reward` is the same
quality as a reward function: the oracle arm trains on it, and every arm validates with it.
"""
from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

from rewards.exact_match import extract_last_number

_QUESTION = re.compile(r"What is (\d+) ([*+]) (\d+)\?")


def optimum(question: str) -> int | None:
    """The true result of the question's product or sum (None when it asks neither)."""
    match = _QUESTION.search(question or "")
    if match is None:
        return None
    a, op, b = int(match.group(1)), match.group(2), int(match.group(3))
    return a * b if op == "*" else a + b


def quality(question: str, answer_text: str) -> float:
    """The hidden quality in [0, 1] of `answer_text` (its last number) for `question`."""
    best = optimum(question)
    number = extract_last_number(answer_text or "")
    if best is None or number is None:
        return 0.0
    try:
        value = Decimal(number)
    except InvalidOperation:
        return 0.0
    if value == best:
        return 1.0
    if best == 0:
        return 0.0
    return 0.5 * max(0.0, 1.0 - float(abs(value - best) / abs(Decimal(best))))


def reward(prompt: str, completion: str, **_) -> float:
    """The true quality as a reward: `reward.function=examples/arena_vs_pointwise/task.py:reward`."""
    return quality(prompt, completion)
