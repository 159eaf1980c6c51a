"""Rule rewards, each used as `rewards.rules:<name>`: answers, format, tool use and length.

    reward:
      function: null
      functions:
        - {function: rewards.rules:numeric_match, weight: 1.0, name: correct}
        - {function: rewards.rules:tags_present, weight: 0.1, name: format, kwargs: {tags: [answer]}}
        - {function: rewards.rules:tool_call_budget, weight: 1.0, kwargs: {budget: 2, penalty: 0.1}}

Answer rules accept `answer` as one string, a list of acceptable strings, or Search-R1's
`{"target": [...]}`, and judge the model's final answer: the content of its last
`<answer>...</answer>` when it wrote one, else the whole completion. Text is normalized as in
SQuAD and Search-R1: lowercased, punctuation and the articles a/an/the removed, whitespace collapsed.

Rules name only the arguments they use and take no `**kwargs`, so a misspelled `kwargs:` key in
the config fails when the reward loads instead of being silently ignored. Penalties are <= 0, so
they subtract from the task reward they are summed with.
"""
from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Callable, Sequence
from decimal import Decimal, InvalidOperation
from typing import Any

from rewards.exact_match import extract_last_number
from rl_factory.base.registry import Registry

RULES: Registry[Callable[..., float]] = Registry("rule")
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.S | re.I)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = set(string.punctuation)
_GSM8K_MARK = "####"


def rule(fn: Callable[..., float]) -> Callable[..., float]:
    """Register `fn` in `RULES` under its own name; a taken name is an error."""
    return RULES.register(fn.__name__)(fn)


# ---- answers -------------------------------------------------------------------------------

@rule
def exact_match(completion: str, answer: Any) -> float:
    """1.0 if the normalized final answer equals a normalized acceptable answer, else 0.0."""
    predicted = normalize_answer(extract_answer(completion))
    return float(any(predicted == normalize_answer(a) for a in acceptable_answers(answer)))


@rule
def token_f1(completion: str, answer: Any) -> float:
    """SQuAD token F1 of the final answer against the best-matching acceptable answer."""
    predicted = normalize_answer(extract_answer(completion)).split()
    return max((_f1(predicted, normalize_answer(a).split()) for a in acceptable_answers(answer)), default=0.0)


@rule
def numeric_match(completion: str, answer: Any, rel_tol: float = 0.0) -> float:
    """1.0 if the model's number equals an acceptable answer's number (within `rel_tol`), else 0.0.

    The model's number is the last number of, in order of preference: its last `\\boxed{...}`,
    the line after its last GSM8K `####`, its `<answer>` tag, the whole completion. An answer's
    number is found the same way, so GSM8K's "... #### 72" works as the dataset answer. Numbers
    compare as decimals ("72.0" = "72", "1,234" = "1234"); fractions and expressions are not evaluated.
    """
    predicted = _number(completion)
    if predicted is None:
        return 0.0
    for a in _answer_list(answer):
        expected = _number(a)
        if expected is not None and expected.is_finite() and abs(predicted - expected) <= Decimal(str(rel_tol)) * abs(expected):
            return 1.0
    return 0.0


# ---- format --------------------------------------------------------------------------------

@rule
def tags_present(completion: str, tags: Sequence[str] = ("answer",)) -> float:
    """1.0 if the completion has every `<tag>...</tag>` in `tags`, each with non-blank content."""
    return float(all(re.search(rf"<{re.escape(t)}>\s*\S.*?</{re.escape(t)}>", completion, re.S)
                     for t in tags))


@rule
def tool_calls_valid(tool_calls: list[dict]) -> float:
    """1.0 if every tool call the model wrote could be parsed (no `parse` errors), else 0.0."""
    return float(not any(c.get("error") for c in tool_calls))


# ---- tool use ------------------------------------------------------------------------------

@rule
def right_tool(tool_calls: list[dict], sample: dict, tool: str | list[str] | None = None,
               column: str = "expected_tool") -> float:
    """1.0 if a well-formed call names the expected tool, else 0.0.

    Args:
        tool: the expected tool name (or acceptable names); by default read from the dataset
            column `column` of each row.
    """
    expected = tool if tool is not None else sample.get(column)
    if expected is None:
        raise ValueError(f"right_tool needs the expected tool: set kwargs {{tool: <name>}} or give the "
                         f"dataset a column {column!r}")
    names = {expected} if isinstance(expected, str) else set(expected)
    return float(any(c.get("name") in names and not c.get("error") for c in tool_calls))


@rule
def no_tool_errors(tool_results: list[dict]) -> float:
    """1.0 if no tool call failed (unknown tool, bad arguments, timeout, server error...), else 0.0."""
    return float(all(r.get("ok") for r in tool_results))


@rule
def tool_call_budget(tool_calls: list[dict], budget: int = 1, penalty: float = 0.1,
                     max_penalty: float = 1.0) -> float:
    """-penalty per tool call beyond `budget` (wasted calls), at most -max_penalty; else 0.0."""
    excess = max(0, len(tool_calls) - budget)
    return -min(max_penalty, penalty * excess) if excess else 0.0  # not -0.0 in the logs


# ---- length --------------------------------------------------------------------------------

@rule
def length_penalty(turns: list[dict], max_tokens: int | None = None, max_chars: int | None = None,
                   window: int = 0) -> float:
    """0.0 within budget; past it -1.0, or with `window` a ramp to -1.0 over `window` tokens/chars.

    Counts what the model generated in all its turns: tokens (`max_tokens`) and/or characters
    (`max_chars`); with both, the larger penalty applies. `window` > 0 is DAPO's soft overlong
    penalty: -(excess / window), capped at -1.
    """
    if max_tokens is None and max_chars is None:
        raise ValueError("length_penalty needs kwargs max_tokens and/or max_chars")
    used_and_budget = []
    if max_tokens is not None:
        used_and_budget.append((sum(t.get("num_tokens", 0) for t in turns), max_tokens))
    if max_chars is not None:
        used_and_budget.append((sum(len(t.get("text") or "") for t in turns), max_chars))
    excess = max(used - budget for used, budget in used_and_budget)
    if excess <= 0:
        return 0.0
    return -1.0 if window <= 0 else -min(1.0, excess / window)


# ---- helpers -------------------------------------------------------------------------------

def normalize_answer(text: Any) -> str:
    """SQuAD / Search-R1 normalization: lowercase, drop punctuation and articles, collapse spaces."""
    text = "".join(ch for ch in str(text).lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def extract_answer(text: str) -> str:
    """The content of the last `<answer>...</answer>`, or the whole text when there is none."""
    found = _ANSWER_TAG.findall(text or "")
    return found[-1] if found else (text or "")


def acceptable_answers(answer: Any) -> list[str]:
    """The answers a prediction may match: a string or number, a list, or {"target": [...]}."""
    return [str(a) for a in _answer_list(answer)]


def _answer_list(answer: Any) -> list[Any]:
    if isinstance(answer, dict) and "target" in answer:  # Search-R1's ground_truth shape
        answer = answer["target"]
    if answer is None:
        return []
    if isinstance(answer, (str, int, float, Decimal)):
        return [answer]
    return [a for a in answer if a is not None]


def extract_boxed(text: str) -> str | None:
    """The content of the last `\\boxed{...}`, nested braces included; None if there is none."""
    start = (text or "").rfind("\\boxed{")
    if start < 0:
        return None
    depth, begin = 0, start + len("\\boxed{")
    for i in range(begin, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth < 0:
            return text[begin:i]
    return None  # unbalanced: the model was cut off mid-box


def _number(text: Any) -> Decimal | None:
    if isinstance(text, (int, float, Decimal)) and not isinstance(text, bool):
        return Decimal(str(text))  # str() of a float may be "1e-05", which no number regex reads whole
    text = str(text)
    boxed = extract_boxed(text)
    if boxed is not None:
        text = boxed
    elif _GSM8K_MARK in text:  # the line after the marker: talk may follow it
        text = text.rpartition(_GSM8K_MARK)[2].strip().partition("\n")[0]
    else:
        text = extract_answer(text)
    number = extract_last_number(text)
    try:
        return Decimal(number) if number is not None else None
    except InvalidOperation:
        return None


def _f1(predicted: list[str], gold: list[str]) -> float:
    if not predicted or not gold:
        return float(predicted == gold)
    same = sum((Counter(predicted) & Counter(gold)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(predicted), same / len(gold)
    return 2 * precision * recall / (precision + recall)


__all__ = [*RULES, "acceptable_answers", "extract_answer", "extract_boxed", "normalize_answer"]
