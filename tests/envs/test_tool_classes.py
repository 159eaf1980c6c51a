"""Tool classes under a manifest's `functions`: a real qwen-agent BaseTool subclass, and classes with qwen-agent's
and Agent-R1's interfaces that import neither; the same schemas, timeouts, output cap and errors as any tool."""
import time

import pytest
import yaml

from envs import ToolEnv
from envs.limits import ToolLimits
from envs.manifest import ManifestError
from rl_factory.types import ToolCall
from tests.compat_fixtures import FIXTURES

pytestmark = pytest.mark.anyio
QWEN_AGENT_EXTRA = "qwen-agent is an extra: .venv/bin/python -m pip install -e '.[qwen-agent]' (bash setup.sh --dev)"


def manifest(tmp_path, *functions) -> str:
    path = tmp_path / "tools.yaml"
    path.write_text(yaml.safe_dump({"functions": list(functions)}))
    return str(path)


async def test_a_qwen_agent_tool_answers_a_call(tmp_path):
    pytest.importorskip("qwen_agent", reason=QWEN_AGENT_EXTRA)
    path = manifest(tmp_path, {"function": f"{FIXTURES / 'qwen_tools.py'}:UnitPrice", "cfg": {"markup": 2}})
    async with ToolEnv.from_manifest(path) as env:
        [schema] = await env.list_tools()
        assert schema["function"]["name"] == "unit_price"
        assert schema["function"]["description"] == "The price of one unit of an item, in cents."
        assert schema["function"]["parameters"] == {  # qwen-agent's list form, as a JSON schema
            "type": "object", "required": ["item"],
            "properties": {"item": {"type": "string", "description": "what to price"},
                           "quantity": {"type": "integer", "description": "how many"}}}
        ok, failed, bad = await env.call_batch([
            ToolCall("unit_price", {"item": "apple", "quantity": 2}), ToolCall("unit_price", {"item": "kiwi"}),
            ToolCall("unit_price", {"quantity": 2})])
    assert ok.ok and ok.text == '{item: "apple", cents: 120}' and ok.server == "functions"  # 2 * 30 * markup 2
    assert failed.error_kind == "server_error" and "ValueError: no price for 'kiwi'" in failed.text
    assert bad.error_kind == "bad_arguments" and "'item' is a required property" in bad.text


async def test_classes_of_either_shape_need_neither_package(tmp_path):
    shaped = FIXTURES / "shaped_tools.py"
    path = manifest(tmp_path, f"{shaped}:Reverse", {"function": f"{shaped}:Shout", "timeout_s": 5})
    async with ToolEnv.from_manifest(path) as env:
        assert [s["function"]["name"] for s in await env.list_tools()] == ["reverse", "shout"]
        reversed_, shouted, raised = await env.call_batch([
            ToolCall("reverse", {"text": "hello"}), ToolCall("shout", {"text": "hi"}),
            ToolCall("shout", {"text": "boom"})])
    assert reversed_.text == "olleh\n[image]"  # a list result: its text, a placeholder for the image
    assert shouted.ok and shouted.text == "HI"  # Agent-R1's (response, reward, extra_info): the response
    assert raised.error_kind == "server_error" and "RuntimeError: shout failed on purpose" in raised.text
    metrics = env.metrics()
    assert metrics["tool/calls"] == 3 and metrics["tool/errors/server_error"] == 1


async def test_timeouts_and_the_output_cap_apply(tmp_path):
    path = manifest(tmp_path, {"function": f"{FIXTURES / 'shaped_tools.py'}:Reverse", "timeout_s": 0.5})
    async with ToolEnv.from_manifest(path, limits=ToolLimits(max_output_bytes=256)) as env:
        start = time.perf_counter()
        slow, long = await env.call_batch([ToolCall("reverse", {"text": "sleep"}),
                                           ToolCall("reverse", {"text": "x" * 5000})])
    assert slow.error_kind == "timeout" and time.perf_counter() - start < 3  # its thread is left behind
    assert long.ok and "bytes truncated ...]" in long.text and len(long.text.encode()) < 400  # of 5000


def test_bad_tool_classes_are_named(tmp_path):
    shaped = FIXTURES / "shaped_tools.py"
    with pytest.raises(ManifestError, match=r"functions\[0\] .*: cfg is for tool classes; a function takes none"):
        ToolEnv.from_manifest(manifest(tmp_path, {"function": "envs.servers.calculator:evaluate", "cfg": {}}))
    with pytest.raises(ManifestError, match=r"functions\[0\] .*building the tool raised TypeError"):
        ToolEnv.from_manifest(manifest(tmp_path, {"function": f"{shaped}:Shout", "cfg": {"nope": 1}}))


def test_a_registered_qwen_agent_name_needs_a_registered_tool(tmp_path):
    pytest.importorskip("qwen_agent", reason=QWEN_AGENT_EXTRA)
    with pytest.raises(ManifestError, match=r"no qwen-agent tool is registered as 'no_such_tool' \(registered: "
                                            r"\[.*'code_interpreter'.*\]\); for a tool class of your own"):
        ToolEnv.from_manifest(manifest(tmp_path, "qwen-agent:no_such_tool"))
