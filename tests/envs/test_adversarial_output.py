"""No model output can crash a step: both parsers and a full rollout against arbitrary and adversarial
assistant text (hypothesis), plus the cases that did crash: deep nesting, huge numbers, lone UTF-16
surrogates, 200 calls in one turn (capped, so they cannot starve a sibling trajectory's call).

The property tests assert what a step needs downstream: `parse` returns, every call's arguments are
a dict (or None with an error), everything is valid Unicode (the rollout file is written as UTF-8),
everything serializes as JSON, and the tool env turns every call into a result, never an exception.
"""
import asyncio
import json
import string
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from envs import ToolEnv, ToolLimits, get_parser
from envs.parsers.safe_json import MAX_DEPTH, MAX_NUMBER_CHARS
from rl_factory.chat import ChatFormat
from rl_factory.engines.base import SamplingParams
from rl_factory.engines.scripted import ScriptedEngine
from rl_factory.evaluate import write_rollouts
from rl_factory.rollout import Agent, RolloutConfig
from rl_factory.types import ToolCall

PARSERS = ["hermes", "qwen3_xml"]
TOOLS = [{"type": "function", "function": {"name": "evaluate", "description": "", "parameters": {
    "type": "object", "properties": {"expression": {"type": "string"}, "n": {"type": "integer"},
                                     "xs": {"type": "array"}}, "required": ["expression"]}}}]
FUNCTION_TOOLS = {"functions": ["envs.servers.calculator:evaluate"]}
GREEDY = SamplingParams(temperature=0.0, max_new_tokens=100_000)


# ---- the strategies: what a model might write -------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20)
nasty_fragments = st.sampled_from([
    "[" * 5000 + "]" * 5000, "{\"a\":" * 3000 + "1" + "}" * 3000, "1" * 5000, "-" + "9" * 400 + ".5e99999",
    '"\\ud800"', '"\\udfff\\ud800"', "NaN", "Infinity", "\x00", "\ufeff", "<tool_call>", "</tool_call>",
    "<function=", "<parameter=", "</function>", "</parameter>", "\\", '"', "\n", "<|im_end|>",
])


@st.composite
def hermes_call(draw) -> str:
    name = draw(st.one_of(st.just("evaluate"), st.text(max_size=12), st.just('\\ud800bad'), nasty_fragments))
    arguments = draw(st.one_of(json_values, nasty_fragments, st.text(max_size=30)))
    body = draw(st.one_of(
        st.just(json.dumps({"name": name, "arguments": arguments}) if not isinstance(arguments, str) or
                arguments not in string.printable else '{"name": "%s", "arguments": %s}' % (name, arguments)),
        st.just('{"name": "%s", "arguments": %s}' % (name, arguments if isinstance(arguments, str) else "{}")),
        st.text(max_size=60)))
    closed = draw(st.booleans())
    return "<tool_call>\n" + body + ("\n</tool_call>" if closed else "")


@st.composite
def xml_call(draw) -> str:
    params = draw(st.lists(st.tuples(st.sampled_from(["expression", "n", "xs", "", "x" * 300]),
                                     st.one_of(st.text(max_size=30), nasty_fragments)), max_size=4))
    body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params)
    name = draw(st.one_of(st.just("evaluate"), st.text(max_size=10), st.just("y" * 500)))
    return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"


assistant_text = st.one_of(
    st.text(max_size=300),
    st.lists(st.one_of(st.text(max_size=40), hermes_call(), xml_call(), nasty_fragments), max_size=8).map("".join),
)


def check_parse(parser_name: str, text: str):
    content, calls = get_parser(parser_name, tools=TOOLS).parse(text)
    assert isinstance(content, str)
    content.encode("utf-8")  # valid Unicode: no lone surrogate reaches a writer
    for call in calls:
        assert isinstance(call.name, str)
        call.name.encode("utf-8")
        assert (call.arguments is None) == (call.error is not None)
        if call.arguments is not None:
            assert isinstance(call.arguments, dict)
            json.dumps(call.arguments, ensure_ascii=False).encode("utf-8")  # serializable, no RecursionError
    return calls


@pytest.mark.parametrize("parser_name", PARSERS)
@given(text=assistant_text)
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_parsers_never_raise(parser_name, text):
    check_parse(parser_name, text)


@pytest.mark.parametrize("parser_name", PARSERS)
@given(text=assistant_text)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_the_tool_env_turns_every_parsed_call_into_a_result(parser_name, text):
    calls = check_parse(parser_name, text)

    async def run():
        async with ToolEnv.from_manifest(FUNCTION_TOOLS) as env:
            return await env.call_batch(calls)

    results = asyncio.run(run())
    assert len(results) == len(calls)
    for result in results:
        result.text.encode("utf-8")
        assert result.ok or result.error_kind and result.text.startswith("Error")


# ---- the findings, one by one -----------------------------------------------------------------


@pytest.mark.parametrize("body", [
    '{"name": "evaluate", "arguments": ' + "[" * 100_000 + "]" * 100_000 + "}",
    '{"name": "evaluate", "arguments": {"n": ' + "9" * 10_000 + "}}",
    '{"name": "evaluate", "arguments": {"n": 1' + "0" * 400 + ".5}}",
])
@pytest.mark.parametrize("parser_name", PARSERS)
def test_deep_nesting_and_long_numbers_become_errors_the_model_sees(parser_name, body):
    if parser_name == "qwen3_xml":  # the same JSON as a typed parameter value
        body = body.split('"arguments": ', 1)[1][:-1]
        text = f"<tool_call>\n<function=evaluate>\n<parameter=xs>\n{body}\n</parameter>\n</function>\n</tool_call>"
    else:
        text = f"<tool_call>\n{body}\n</tool_call>"
    (call,) = check_parse(parser_name, text)
    if parser_name == "hermes":
        assert call.arguments is None
        assert f"at most {MAX_DEPTH}" in call.error or f"at most {MAX_NUMBER_CHARS}" in call.error
    else:
        assert isinstance(call.arguments["xs"], str)  # left as text; the schema check will say so


def test_a_lone_surrogate_in_a_tool_name_is_an_error_and_the_rollout_file_is_written(tokenizer, tmp_path):
    bad = '<tool_call>\n{"name": "\\ud800evaluate", "arguments": {"expression": "\\udfff 1+1"}}\n</tool_call>'
    good = bad.replace("\\ud800evaluate", "evaluate")
    traj, metrics = asyncio.run(rollout(tokenizer, [bad + "\n" + good, "done"]))
    path = tmp_path / "rollouts" / "step_000001.jsonl"  # where the trainer writes a step's trajectories
    write_rollouts(path, [traj])
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no .tmp left behind
    record = json.loads(path.read_bytes().decode("utf-8"))  # strict UTF-8: nothing unencodable got in
    refused, repaired = record["tool_calls"]
    assert refused["name"] == "" and refused["arguments"] is None and "valid Unicode" in refused["error"]
    assert repaired == {"name": "evaluate", "arguments": {"expression": "\ufffd 1+1"}, "error": None}
    assert [r["error_kind"] for r in record["tool_results"]] == ["parse", "server_error"]  # "\ufffd 1+1" is no sum
    assert record["turn_texts"][0] == bad + "\n" + good  # the model's own escapes, kept as it wrote them
    assert metrics["tool/errors/parse"] == 1


NAMED = {  # one tool name, as each wire format writes it
    "hermes": '<tool_call>\n{"name": "%s", "arguments": {"expression": "1"}}\n</tool_call>',
    "qwen3_xml": "<tool_call>\n<function=%s>\n<parameter=expression>\n1\n</parameter>\n</function>\n</tool_call>",
}


@pytest.mark.parametrize("name", ["evaluate\ud800", "\udfffevaluate", "evaluate\ufffd", "e" * 201])
@pytest.mark.parametrize("parser_name", PARSERS)
def test_both_parsers_refuse_the_same_invalid_tool_names(parser_name, name):
    (call,) = check_parse(parser_name, NAMED[parser_name] % name)
    assert (call.name, call.arguments) == ("", None)
    assert call.error == "the tool name must be at most 200 characters of valid Unicode"
    results = asyncio.run(_call_batch([call]))
    assert results[0].error_kind == "parse"  # not "unknown_tool": the model is told what was wrong


async def _call_batch(calls):
    async with ToolEnv.from_manifest(FUNCTION_TOOLS) as env:
        return await env.call_batch(calls)


async def rollout(tokenizer, script, limits=None, **cfg):
    async with ToolEnv.from_manifest(FUNCTION_TOOLS, limits=limits) as env:
        tools = await env.list_tools()
        config = RolloutConfig(**{"max_turns": 2, "max_response_tokens": 100_000, "max_total_tokens": 1_000_000,
                                  "max_tool_response_tokens": 64, **cfg})
        agent = Agent(ScriptedEngine(tokenizer, script), env, ChatFormat(tokenizer, tools), get_parser("hermes"),
                      config)
        traj = await agent.rollout({"messages": [{"role": "user", "content": "hi"}]}, 0, GREEDY)
        return traj, env.metrics()


@given(text=assistant_text)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
def test_a_full_rollout_never_raises(tokenizer, tmp_path, text):
    traj, _ = asyncio.run(rollout(tokenizer, [text, "done"]))
    write_rollouts(tmp_path / "step.jsonl", [traj])
    assert not list(tmp_path.glob(".*.tmp"))


def test_surrogates_in_a_trajectory_still_write_the_rollout_file(tokenizer, tmp_path):
    call = '<tool_call>\n{"name": "\\ud800x", "arguments": {}}\n</tool_call>'
    traj, metrics = asyncio.run(rollout(tokenizer, [call, "done"]))
    traj.turns[0].tool_calls.append(ToolCall("\ud800", {"k": "\udfff"}))  # even one that skipped the parser
    write_rollouts(tmp_path / "step.jsonl", [traj])
    line = (tmp_path / "step.jsonl").read_text(encoding="utf-8")
    assert json.loads(line)["tool_calls"][-1]["name"] == "\ud800"  # written escaped, read back as is
    assert metrics["tool/errors/parse"] == 1 and not list(tmp_path.glob(".*.tmp"))


def test_two_hundred_calls_in_one_turn_are_capped(tokenizer):
    calls = "".join('<tool_call>\n{"name": "evaluate", "arguments": {"expression": "%d + 1"}}\n</tool_call>\n' % i
                    for i in range(200))
    start = time.perf_counter()
    traj, metrics = asyncio.run(rollout(tokenizer, [calls, "done"], limits=ToolLimits(max_calls_per_turn=16)))
    results = traj.turns[0].tool_results
    assert [r.ok for r in results[:16]] == [True] * 16 and [r.text for r in results[:2]] == ["1", "2"]
    assert {r.error_kind for r in results[16:]} == {"too_many_calls"} and len(results) == 200
    assert "at most 16 run per turn (env.max_calls_per_turn)" in results[16].text
    assert metrics["tool/errors/too_many_calls"] == 184
    assert time.perf_counter() - start < 30


# One repeated fragment per text; before the name patterns stopped at "<", each "<function=" scanned to the
# end of the text: 160 KB took 56 s. 400 KB must take well under a second (the limit is 100x that, to be
# safe on a loaded CI machine; benchmarks/parsers.py measures 1 MB).
UNCLOSED_TAGS = ["<tool_call>" + "<function=" * 40_000, "<tool_call><function=f>" + "<parameter=" * 40_000,
                 "<tool_call>" * 40_000, "<tool_call>" + '{"name": "' * 40_000]


@pytest.mark.parametrize("parser_name", PARSERS)
@pytest.mark.parametrize("text", UNCLOSED_TAGS, ids=["function", "parameter", "tool_call", "json_name"])
def test_a_flood_of_unclosed_tags_parses_in_linear_time(parser_name, text):
    start = time.perf_counter()
    get_parser(parser_name, tools=TOOLS).parse(text)
    assert time.perf_counter() - start < 10


@pytest.mark.parametrize("parser_name", PARSERS)
def test_blocks_past_the_cap_become_one_malformed_call(parser_name):
    from envs.parsers.blocks import MAX_BLOCKS

    one = ('<tool_call>{"name": "evaluate", "arguments": {"expression": "1"}}</tool_call>' if parser_name == "hermes"
           else "<tool_call><function=evaluate><parameter=expression>1</parameter></function></tool_call>")
    content, calls = get_parser(parser_name, tools=TOOLS).parse("hi " + one * (MAX_BLOCKS + 5))
    assert content == "hi" and len(calls) == MAX_BLOCKS + 1
    assert all(c.error is None and c.arguments == {"expression": "1"} for c in calls[:MAX_BLOCKS])
    assert calls[-1].error == f"5 more <tool_call> blocks were not read (at most {MAX_BLOCKS} per turn)"


@pytest.mark.anyio
async def test_a_flood_of_calls_does_not_starve_a_sibling_trajectorys_call(tmp_path, write_manifest, fault_server):
    # A server that serves one call at a time, and a per-call timeout of 2 s. Uncapped, the sibling's
    # call would queue on the server behind up to max_concurrency (64) of the flood's calls: 3.2 s.
    path = write_manifest(tmp_path, {"faulty": fault_server(timeout_s=2)})
    async with ToolEnv.from_manifest(path) as env:  # default limits: 16 calls of a turn run
        await env.list_tools()
        flood = asyncio.ensure_future(env.call_batch([ToolCall("serial", {"seconds": 0.05})] * 200))
        await asyncio.sleep(0.1)  # the flood's calls reach the server first
        (sibling,) = await env.call_batch([ToolCall("serial", {"seconds": 0.05})])
        flooded = await flood
    assert sibling.ok, sibling.text
    assert all(r.ok for r in flooded[:16]), [r.text for r in flooded[:16] if not r.ok]
    assert {r.error_kind for r in flooded[16:]} == {"too_many_calls"}
