"""pass@k, the failure taxonomy, breakdowns and the bootstrap comparison, against hand-computed values."""
import math

import pytest

from rl_factory import analysis


def rec(row, reward, stop="answer", calls=(), results=(), source=None):
    return {"sample_index": row, "id": f"r{row}", "reward": reward, "stop_reason": stop, "data_source": source,
            "tool_calls": [{"name": n, "arguments": {}, "error": e} for n, e in calls],
            "tool_results": [{"name": n, "error_kind": k} for n, k in results]}


def test_pass_at_k_is_the_unbiased_estimator():
    # row 0: 1 of 4 correct; row 1: 0 of 4; row 2: 4 of 4
    records = [rec(0, r) for r in (1, 0, 0, 0)] + [rec(1, 0)] * 4 + [rec(2, 1)] * 4
    got = analysis.pass_at_k(records, threshold=1.0)
    assert set(got) == {"1", "2", "4"}
    assert got["1"] == pytest.approx((0.25 + 0 + 1) / 3)
    assert got["2"] == pytest.approx((1 - math.comb(3, 2) / math.comb(4, 2) + 0 + 1) / 3)
    assert got["4"] == pytest.approx((1 + 0 + 1) / 3)


def test_each_failure_gets_the_first_cause_that_applies():
    records = [
        rec(0, 1.0),  # success: not a failure
        rec(1, 0.0, stop="max_tokens", calls=[("calc", "invalid JSON")]),  # truncated wins over malformed
        rec(2, 0.0, calls=[("calc", "invalid JSON")], results=[("calc", "parse")]),
        rec(3, 0.0, calls=[("calc", None)], results=[("calc", "timeout")]),
        rec(4, 0.0),
        rec(5, 0.0, calls=[("calc", None)], results=[("calc", None)]),
    ]
    got = analysis.failure_taxonomy(records, 1.0, has_tools=True)
    assert {k: v["count"] for k, v in got.items()} == {"truncated": 1, "malformed call": 1, "tool error": 1,
                                                     "no tool call": 1, "wrong answer": 1}
    assert got["tool error"]["examples"] == ["r3"] and got["truncated"]["share"] == pytest.approx(1 / 6)
    without_tools = analysis.failure_taxonomy([rec(4, 0.0)], 1.0, has_tools=False)
    assert list(without_tools) == ["wrong answer"]



def test_a_clean_low_score_is_named_by_how_the_trajectory_stopped():
    """The turns ran out (a game still answered, or tools still being called) or the environment ended the
    episode: not a "wrong answer" the model gave."""
    records = [rec(0, 0.0, stop="max_turns"), rec(1, 0.0, stop="env_done"), rec(2, 0.0),
               rec(3, 0.0, stop="max_turns", calls=[("calc", None)], results=[("calc", None)]),
               rec(4, 0.0, stop="max_turns", calls=[("calc", None)], results=[("calc", "timeout")]),
               rec(5, 1.0, stop="max_turns")]
    without_tools = analysis.failure_taxonomy(records[:3], 0.1, has_tools=False)
    assert {k: v["examples"] for k, v in without_tools.items()} == {
        "not solved in max_turns": ["r0"], "ended by the environment": ["r1"], "wrong answer": ["r2"]}
    with_tools = analysis.failure_taxonomy(records[3:], 0.1, has_tools=True)
    assert {k: v["count"] for k, v in with_tools.items()} == {"tool error": 1, "not solved in max_turns": 1}


def test_breakdowns_by_data_source_and_tool():
    records = [rec(0, 1.0, calls=[("calc", None)], results=[("calc", None)], source="math"),
               rec(1, 0.0, calls=[("calc", None), ("search", None)], results=[("calc", "timeout"), ("search", None)],
                   source="math"),
               rec(2, 1.0, source="trivia")]
    sources = analysis.by_data_source(records, 1.0)
    assert sources["math"]["accuracy"] == 0.5 and sources["trivia"]["accuracy"] == 1.0
    assert sources["math"]["tool/success_rate"] == pytest.approx(2 / 3)
    tools = analysis.by_tool(records, 1.0)
    assert tools["calc"] == {"calls": 2, "errors": {"timeout": 1}, "success_rate": 0.5, "accuracy_when_used": 0.5}
    assert tools["search"]["accuracy_when_used"] == 0.0


def test_bootstrap_ci_covers_a_clear_difference_and_not_a_null_one():
    better = [{"id": f"r{i}", "correct": 1.0 if i % 10 < 8 else 0.0, "reward": 0.0} for i in range(100)]
    worse = [{"id": f"r{i}", "correct": 1.0 if i % 10 < 3 else 0.0, "reward": 0.0} for i in range(100)]
    result = analysis.compare(better, worse, resamples=500)
    acc = result["metrics"]["accuracy"]
    assert result["paired"] and acc["difference"] == pytest.approx(0.5)
    assert 0.35 < acc["ci_low"] < 0.5 < acc["ci_high"] < 0.65 and acc["significant"]
    same = analysis.compare(better, better, resamples=200)["metrics"]["accuracy"]
    assert same["difference"] == 0.0 and not same["significant"]
    unpaired = analysis.compare(better[:50], worse, resamples=200)
    assert not unpaired["paired"] and unpaired["rows"] == [50, 100]
