"""Every rule of rewards/rules.py against hand-made cases, called the way the loader calls it."""
import asyncio

import pytest

from rewards import rules
from rewards.combine import RewardConfig
from rewards.scorer import build_scorer
from rewards.loader import RewardLoadError, load_reward
from rewards.scorer import score_trajectories
from rl_factory.types import ToolCall, ToolResult, Trajectory, Turn


@pytest.mark.parametrize("text, expected", [
    ("The Eiffel Tower!", "eiffel tower"),
    ("  A   cat, an apple; THE end. ", "cat apple end"),
    ("Theatre", "theatre"),  # articles only as whole words
    ("U.S.A.", "usa"),
    ("", ""),
])
def test_normalize_answer(text, expected):
    assert rules.normalize_answer(text) == expected


@pytest.mark.parametrize("completion, answer, expected", [
    ("<answer>The Eiffel Tower</answer>", "eiffel tower", 1.0),
    ("I think... <answer>Paris</answer> no wait <answer>Lyon</answer>", "Paris", 0.0),  # the last tag counts
    ("paris.", ["Lyon", "Paris"], 1.0),  # no tag: the whole completion; any acceptable answer
    ("<answer>Paris, France</answer>", "Paris", 0.0),
    ("<answer>Paris</answer>", {"target": ["paris"]}, 1.0),  # Search-R1's ground_truth shape
    ("<answer>Paris</answer>", None, 0.0),
    ("<answer>42</answer>", 42, 1.0),
])
def test_exact_match(completion, answer, expected):
    assert rules.exact_match(completion, answer) == expected


@pytest.mark.parametrize("completion, answer, expected", [
    ("<answer>the eiffel tower in paris</answer>", "Eiffel Tower", pytest.approx(2 * (2 / 4) * 1 / (2 / 4 + 1))),
    ("<answer>Eiffel Tower</answer>", ["Louvre", "the Eiffel Tower"], 1.0),
    ("<answer>tower tower</answer>", "eiffel tower", pytest.approx(0.5)),  # a token counts as often as in gold
    ("<answer>Louvre</answer>", "Eiffel Tower", 0.0),
    ("<answer>the</answer>", "a", 1.0),  # both normalize to nothing: SQuAD scores that as a match
    ("<answer>Paris</answer>", [], 0.0),
])
def test_token_f1(completion, answer, expected):
    assert rules.token_f1(completion, answer) == expected


@pytest.mark.parametrize("completion, answer, expected", [
    ("So the total is 72.", "72", 1.0),
    ("He earns 3 * 24 = 72 dollars", "Natalia sold 48/2 = 24 clips.\n#### 72", 1.0),  # GSM8K answer
    ("The answer is \\boxed{1,234} (not 7)", "1234", 1.0),  # boxed wins over the last number
    ("\\boxed{\\frac{3}{4}}", "4", 1.0),  # the last number inside the box: fractions are not evaluated
    ("#### 18\nthat is 3 apples", 18, 1.0),  # GSM8K-style marker in the completion
    ("<answer>0.50</answer> of 7", 0.5, 1.0),  # no box or marker: the answer tag
    ("72.0", "72", 1.0),
    ("71", "72", 0.0),
    ("about 3.14", "3.14159", 0.0),
    ("no number here", "72", 0.0),
    ("\\boxed{12", "12", 1.0),  # unbalanced box: fall back to the answer tag / whole text
    ("1e-05 is 0.00001", 1e-05, 1.0),  # a float answer is compared as a number, not as its repr
    ("72", None, 0.0),
    ("8", ["7", "8"], 1.0),
])
def test_numeric_match(completion, answer, expected):
    assert rules.numeric_match(completion, answer) == expected


def test_numeric_match_tolerance():
    assert rules.numeric_match("about 3.14", "3.14159", rel_tol=1e-3) == 1.0
    assert rules.numeric_match("about 3.2", "3.14159", rel_tol=1e-3) == 0.0


@pytest.mark.parametrize("completion, tags, expected", [
    ("<think>hmm</think> <answer>7</answer>", ("answer",), 1.0),
    ("<think>hmm</think> <answer>7</answer>", ("think", "answer"), 1.0),
    ("<answer>7</answer>", ("think", "answer"), 0.0),
    ("<answer>   </answer>", ("answer",), 0.0),  # empty content does not count
    ("<answer>7", ("answer",), 0.0),  # unclosed
    ("<answer>\nmulti\nline\n</answer>", ("answer",), 1.0),
])
def test_tags_present(completion, tags, expected):
    assert rules.tags_present(completion, tags) == expected


GOOD = {"name": "calculator", "arguments": {"expression": "1+1"}, "error": None}
BAD = {"name": "calculator", "arguments": None, "error": "invalid JSON"}
OTHER = {"name": "search", "arguments": {"query": "x"}, "error": None}


def test_tool_calls_valid():
    assert rules.tool_calls_valid([]) == 1.0
    assert rules.tool_calls_valid([GOOD, OTHER]) == 1.0
    assert rules.tool_calls_valid([GOOD, BAD]) == 0.0


def test_right_tool_from_argument_or_column():
    assert rules.right_tool([OTHER, GOOD], sample={}, tool="calculator") == 1.0
    assert rules.right_tool([OTHER], sample={}, tool="calculator") == 0.0
    assert rules.right_tool([BAD], sample={}, tool="calculator") == 0.0  # a malformed call is not a call
    assert rules.right_tool([OTHER], sample={}, tool=["calculator", "search"]) == 1.0
    assert rules.right_tool([GOOD], sample={"expected_tool": "calculator"}) == 1.0
    assert rules.right_tool([GOOD], sample={"gold": "search"}, column="gold") == 0.0
    with pytest.raises(ValueError, match="column 'expected_tool'"):
        rules.right_tool([GOOD], sample={})


def test_no_tool_errors():
    ok = {"name": "calculator", "text": "2", "ok": True, "error_kind": None}
    failed = {"name": "calculator", "text": "Error: timed out", "ok": False, "error_kind": "timeout"}
    assert rules.no_tool_errors([]) == 1.0
    assert rules.no_tool_errors([ok, ok]) == 1.0
    assert rules.no_tool_errors([ok, failed]) == 0.0


@pytest.mark.parametrize("calls, kwargs, expected", [
    (0, {}, 0.0),
    (1, {}, 0.0),
    (3, {}, pytest.approx(-0.2)),  # two calls past the budget of one
    (3, {"budget": 3}, 0.0),
    (30, {"penalty": 0.5}, -1.0),  # capped at max_penalty
    (30, {"penalty": 0.5, "max_penalty": 2.0}, -2.0),
])
def test_tool_call_budget(calls, kwargs, expected):
    assert rules.tool_call_budget([GOOD] * calls, **kwargs) == expected


def turns(*sizes):
    return [{"text": "x" * n, "num_tokens": n, "tool_calls": [], "tool_results": []} for n in sizes]


@pytest.mark.parametrize("sizes, kwargs, expected", [
    ((30, 20), {"max_tokens": 50}, 0.0),
    ((30, 21), {"max_tokens": 50}, -1.0),  # hard: any excess
    ((30, 30), {"max_tokens": 50, "window": 20}, -0.5),  # soft: 10 over a 20-token window
    ((30, 90), {"max_tokens": 50, "window": 20}, -1.0),  # capped
    ((10,), {"max_chars": 5, "max_tokens": 100, "window": 10}, -0.5),  # the larger of the two penalties
])
def test_length_penalty(sizes, kwargs, expected):
    assert rules.length_penalty(turns(*sizes), **kwargs) == expected


def test_length_penalty_needs_a_budget():
    with pytest.raises(ValueError, match="max_tokens and/or max_chars"):
        rules.length_penalty(turns(3))


def test_rules_load_by_name_and_reject_misspelled_kwargs():
    assert set(rules.RULES) >= {"exact_match", "token_f1", "numeric_match", "tags_present", "tool_calls_valid",
                                "right_tool", "no_tool_errors", "tool_call_budget", "length_penalty"}
    with pytest.raises(RewardLoadError, match="has no parameter 'budgt'"):
        load_reward("rewards.rules:tool_call_budget", bound={"budgt": 2})
    with pytest.raises(RewardLoadError, match="callables there: .*'numeric_match'"):
        load_reward("rewards.rules:numeric")


def test_rules_combined_on_a_real_trajectory():
    call = ToolCall("calculator", {"expression": "6*7"})
    traj = Trajectory(
        sample_index=0, prompt_ids=[0], token_ids=[0, 1, 2, 3], loss_mask=[0, 1, 1, 1],
        logprobs=[0.0] * 4, messages=[], stop_reason="answer",
        turns=[Turn([1], [0.0], "<tool_call>...</tool_call>", [call], [ToolResult(call, "42")]),
               Turn([2, 3], [0.0, 0.0], "<answer>42</answer>")],
        sample={"prompt": "6*7?", "answer": "#### 42", "expected_tool": "calculator"})
    reward = build_scorer(RewardConfig(functions=[
        {"function": "rewards.rules:numeric_match", "name": "correct"},
        {"function": "rewards.rules:tags_present", "weight": 0.1, "name": "format"},
        {"function": "rewards.rules:right_tool", "weight": 0.2},
        {"function": "rewards.rules:length_penalty", "weight": 0.5, "kwargs": {"max_tokens": 2}},
    ]))
    metrics = asyncio.run(score_trajectories(reward, [traj]))
    assert traj.reward_info == {"correct": 1.0, "format": 1.0, "right_tool": 1.0, "length_penalty": -1.0}
    assert traj.reward == pytest.approx(1.0 + 0.1 + 0.2 - 0.5)
    assert metrics["reward/length_penalty/mean"] == -1.0
