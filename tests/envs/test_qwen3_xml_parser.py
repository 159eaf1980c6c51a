"""The Qwen3-Coder / Qwen3.5 XML tool-call format (`qwen3_xml`): values typed by the schemas."""
import pytest

from envs.parsers import PARSERS, get_parser

PROPERTIES = {"query": {"type": "string"}, "k": {"type": "integer"}, "weights": {"type": "array"},
              "filters": {"type": "object"}, "exact": {"type": "boolean"},
              "limit": {"anyOf": [{"type": "number"}, {"type": "null"}]}, "tag": {"type": ["string", "integer"]},
              "anything": {}}
TOOLS = [{"type": "function", "function": {"name": "search",
                                           "parameters": {"type": "object", "properties": PROPERTIES}}}]


def block(name: str, **params: str) -> str:
    inner = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params.items())
    return f"<tool_call>\n<function={name}>\n{inner}</function>\n</tool_call>"


@pytest.fixture
def parse():
    return get_parser("qwen3_xml", tools=TOOLS).parse


def test_registered():
    assert {"hermes", "qwen3_xml"} <= set(PARSERS)


def test_values_follow_the_schema(parse):
    text = "<think>\nlook it up\n</think>\n\n" + block(
        "search", query="42", k="5", weights="[0.5, 1]", filters='{"lang": "en"}', exact="true", limit="null",
        tag="7", anything="[1]") + "<|im_end|>"
    content, (call,) = parse(text)
    assert content == "<think>\nlook it up\n</think>"
    assert call.error is None and call.name == "search"
    assert call.arguments == {"query": "42", "k": 5, "weights": [0.5, 1], "filters": {"lang": "en"}, "exact": True,
                              "limit": None, "tag": 7, "anything": [1]}


@pytest.mark.parametrize("value, expected", [
    ("  two words \n", "  two words \n"),  # only the one newline on each side is framing
    ("line 1\nline 2", "line 1\nline 2"),
    ("<b>html</b> & more", "<b>html</b> & more"),
])
def test_string_values_are_kept_exactly(parse, value, expected):
    (call,) = parse(block("search", query=value))[1]
    assert call.arguments == {"query": expected}


def test_unparsable_or_untyped_values_stay_strings(parse):
    (call,) = parse(block("search", k="five", exact="True", tag="x"))[1]
    assert call.arguments == {"k": "five", "exact": True, "tag": "x"}  # the argument check judges "five"
    (call,) = get_parser("qwen3_xml").parse(block("search", k="5"))[1]
    assert call.arguments == {"k": "5"}  # no schemas given: text stays text
    (call,) = parse(block("other_tool", n="5"))[1]
    assert call.arguments == {"n": "5"}


def test_two_calls_and_missing_closing_tags(parse):
    text = block("search", query="a") + "\n<tool_call>\n<function=search>\n<parameter=query>\nb\n<parameter=k>\n2\n"
    content, calls = parse(text)  # the second block was cut off by the token budget
    assert content == ""
    assert [c.arguments for c in calls] == [{"query": "a"}, {"query": "b", "k": 2}]


@pytest.mark.parametrize("body, name, error", [
    ('{"name": "search", "arguments": {}}', "search", "expected <function=NAME>"),  # hermes JSON
    ("<function=>\n</function>", "", "empty function name"),
    ("<function=search>\n<parameter=k>\n1\n</parameter>\n<parameter=k>\n2\n</parameter>\n</function>", "search",
     "parameter 'k' is given twice"),
    ("", "", "empty <tool_call> block"),
])
def test_malformed_block_is_a_call_with_an_error(parse, body, name, error):
    (call,) = parse(f"<tool_call>\n{body}\n</tool_call>")[1]
    assert call.name == name and call.arguments is None and error in call.error


def test_malformed_and_good_in_one_turn(parse):
    bad = "<tool_call>\n<function search>\n</tool_call>"
    content, calls = parse("Let me search.\n" + bad + "\n" + block("search", query="q"))
    assert content == "Let me search."
    assert calls[0].error and calls[0].raw == bad
    assert (calls[1].name, calls[1].arguments, calls[1].error) == ("search", {"query": "q"}, None)


def test_no_calls(parse):
    assert parse("The answer is 42.<|im_end|>") == ("The answer is 42.", [])
