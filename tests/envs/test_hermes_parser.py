"""Hermes tool-call parsing (Qwen2.5/Qwen3) and the parser registry."""
import pytest

from envs.parsers import PARSERS, get_parser, register_parser

CALC = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "%s"}}\n</tool_call>'


@pytest.fixture
def parse():
    return get_parser("hermes").parse


def test_registry():
    assert "hermes" in PARSERS
    with pytest.raises(KeyError, match=r"unknown tool-call parser 'nope'; valid: \[.*'hermes'"):
        get_parser("nope")
    with pytest.raises(ValueError, match="already registered"):
        register_parser("hermes")(type("Other", (), {}))


def test_two_calls(parse):
    think = "<think>\nadd both\n</think>\n\nLet me compute.\n"
    text = think + CALC % "2+3" + "\n" + CALC % "4*5" + "<|im_end|>"
    content, calls = parse(text)
    assert content == "<think>\nadd both\n</think>\n\nLet me compute."
    assert [(c.name, c.arguments, c.error) for c in calls] == [
        ("calculator", {"expression": "2+3"}, None), ("calculator", {"expression": "4*5"}, None)]
    assert calls[0].raw == CALC % "2+3"


def test_malformed_and_good(parse):
    bad = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "1+1"}\n</tool_call>'
    content, calls = parse(bad + "\n" + CALC % "6*7")
    assert content == ""
    assert calls[0].name == "calculator"  # best guess, so metrics and messages can name it
    assert calls[0].arguments is None and "invalid JSON" in calls[0].error and calls[0].raw == bad
    assert (calls[1].name, calls[1].arguments, calls[1].error) == ("calculator", {"expression": "6*7"}, None)


def test_unterminated_last_block(parse):
    text = CALC % "1+1" + '\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "2+2"}}\n'
    content, calls = parse(text)
    assert content == ""
    assert [c.arguments for c in calls] == [{"expression": "1+1"}, {"expression": "2+2"}]
    content, calls = parse('ok <tool_call>\n{"name": "calculator", "argu')  # cut by the token budget
    assert content == "ok" and calls[0].error and calls[0].name == "calculator"


def test_no_calls(parse):
    assert parse("The answer is 42.<|im_end|>") == ("The answer is 42.", [])
    assert parse("") == ("", [])


@pytest.mark.parametrize("body, name, arguments, error", [
    ('{"name": "f", "arguments": "{\\"a\\": 1}"}', "f", {"a": 1}, None),  # arguments as JSON string
    ('{"name": "f"}', "f", {}, None),  # no arguments
    ('{"name": "f", "arguments": ""}', "f", {}, None),
    ('{"name": "f", "arguments": [1]}', "f", None, '"arguments" must be a JSON object'),
    ('{"name": "f", "arguments": "{bad"}', "f", None, "not valid JSON"),
    ('{"arguments": {}}', "", None, 'missing "name"'),
    ('[1, 2]', "", None, "expected a JSON object"),
    ('', "", None, "empty <tool_call> block"),
])
def test_block_shapes(parse, body, name, arguments, error):
    (call,) = parse(f"<tool_call>{body}</tool_call>")[1]
    assert (call.name, call.arguments) == (name, arguments)
    assert (call.error is None) if error is None else (error in call.error)
