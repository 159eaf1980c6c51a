"""Our tool/* counters from the rollouts lines verl's workers write (pure: no verl import)."""
from rl_factory.backends.verl.run_dir import tool_counts


def _line(*results):
    return {"tool_results": [{"name": n, "error_kind": k, "latency_s": 0.01} for n, k in results]}


def test_garbled_calls_are_pooled_not_keyed_by_whatever_name_the_model_wrote():
    # seen on the H200: parse errors with an empty name produced `tool//calls` and `tool//errors/parse`
    lines = [_line(("calculator", None), ("", "parse"), ("calculator", "parse")),
             _line(("nonsense<x", "parse"), ("search", "unknown_tool"))]
    counts = tool_counts(lines)
    assert counts["tool/calls"] == 5
    assert counts["tool/calculator/calls"] == 2 and counts["tool/calculator/errors/parse"] == 1
    assert counts["tool/_invalid/calls"] == 3 and counts["tool/_invalid/errors/parse"] == 2
    assert counts["tool/_invalid/errors/unknown_tool"] == 1
    assert not [k for k in counts if k.startswith("tool//") or "nonsense" in k or "search" in k]


def test_the_manifest_names_decide_when_given():
    counts = tool_counts([_line(("calculator", "parse"))], tool_names={"calculator"})
    assert counts["tool/calculator/errors/parse"] == 1
