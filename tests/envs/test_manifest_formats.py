"""RL-Factory's tool configs as manifests: `.pydata` (a Python literal, never executed) and the same list as
JSON; entries merged as RL-Factory merges them; errors that name the entry."""
import json
import subprocess
import sys

import pytest

from envs import ToolEnv
from envs.manifest import ManifestError, load_manifest
from rl_factory.types import ToolCall
from tests.compat_fixtures import PYDATA
from tests.e2e.test_main_scripts import REPO

pytestmark = pytest.mark.anyio

TOOL_NAMES = ["calc-calculator", "notes-put", "notes-get", "notes-whoami", "notes-lookup"]


async def test_a_pydata_manifest_with_two_servers_lists_and_calls_its_tools():
    async with ToolEnv.from_manifest(PYDATA) as env:
        schemas = await env.list_tools()
        assert [s["function"]["name"] for s in schemas] == TOOL_NAMES  # qwen-agent's <server>-<tool> names
        [added, put] = await env.call_batch([
            ToolCall("calc-calculator", {"expression": "2033 + 5179"}),
            ToolCall("notes-put", {"key": "k", "value": "v"})])
        assert (added.ok, added.text, added.server) == (True, "7212", "calc")
        assert put.ok and put.server == "notes"


def test_the_cli_lists_a_pydata_manifest():
    listed = subprocess.run([sys.executable, "-m", "envs", "list", str(PYDATA)], cwd=REPO, capture_output=True,
                            text=True, timeout=120)
    assert listed.returncode == 0, listed.stderr[-2000:]
    assert [line.split()[1].rstrip(":") for line in listed.stdout.splitlines() if line.startswith("[")] == TOOL_NAMES


def test_pydata_is_parsed_never_executed(tmp_path):
    marker = tmp_path / "ran"
    path = tmp_path / "tools.pydata"
    path.write_text(f"[{{'mcpServers': {{}}}}, __import__('pathlib').Path({str(marker)!r}).touch()]")
    with pytest.raises(ManifestError, match=r"tools\.pydata: not a Python literal.*ast\.literal_eval"):
        load_manifest(path)
    assert not marker.exists()


def test_entries_merge_later_servers_win_and_url_servers_are_sse(tmp_path):
    entries = [{"mcpServers": {"a": {"command": "python3", "args": ["first.py"]},
                               "web": {"url": "http://127.0.0.1:9/sse", "sse_read_timeout": 30}}},
               {"mcpServers": {"a": {"command": "python3", "args": ["second.py"]},
                               "http": {"url": "http://127.0.0.1:9/mcp", "type": "streamable-http"}}},
               {"mcpServers": {"mine": {"command": "python3", "args": ["x.py"], "prefix": False}}}]
    path = tmp_path / "tools.pydata"
    path.write_text(repr(entries))
    manifest = load_manifest(path)
    assert list(manifest.servers) == ["a", "web", "http", "mine"]
    assert manifest.servers["a"].args == ["second.py"]
    assert manifest.servers["web"].transport == "sse" and manifest.servers["http"].transport == "streamable_http"
    assert manifest.servers["a"].tool_prefix("a") == "a-" and manifest.servers["mine"].tool_prefix("mine") == ""
    as_json = tmp_path / "tools.json"  # the same list as JSON
    as_json.write_text(json.dumps(entries))
    assert load_manifest(as_json).servers == manifest.servers


@pytest.mark.parametrize("entries, message", [
    ([{"mcpServers": {"ok": {"command": "python3"}}}, {"mcpServers": {"calc": {"comand": "python3"}}}],
     r"entry \[1\]: mcpServers\.calc: unknown key 'comand' \(did you mean 'command'\?\)"),
    ([{"mcpServers": {}}, 42], r"entry \[1\]: expected \{'mcpServers'"),
    ([{"mcpServers": {}, "tools": []}], r"entry \[0\]: unknown key 'tools'"),
    (["not an identifier!"], r"entry \[0\]: a qwen-agent tool's registered name must be an identifier"),
])
def test_a_bad_entry_is_named(tmp_path, entries, message):
    path = tmp_path / "tools.pydata"
    path.write_text(repr(entries))
    with pytest.raises(ManifestError, match=r"tools\.pydata: " + message):
        load_manifest(path)


def test_name_entries_are_qwen_agent_tools_and_the_webui_spec_is_refused(tmp_path):
    path = tmp_path / "tools.pydata"
    path.write_text(repr(["code_interpreter", {"name": "web_search", "timeout": 5}]))
    functions = load_manifest(path).functions
    assert [(f.function, f.cfg) for f in functions] == [
        ("qwen-agent:code_interpreter", None), ("qwen-agent:web_search", {"name": "web_search", "timeout": 5})]
    webui = tmp_path / "calculator.json"
    webui.write_text(json.dumps({"name": "calc", "systemPrompt": "...", "externalTools": [{"pythonCode": "..."}]}))
    with pytest.raises(ManifestError, match="RL-Factory's WebUI tool spec .* not a manifest"):
        load_manifest(webui)


def test_a_pydata_file_holding_one_entry_reads_as_a_list_of_one(tmp_path):
    path = tmp_path / "tools.pydata"
    path.write_text(repr({"mcpServers": {"web": {"url": "http://127.0.0.1:9/sse"}}}))
    web = load_manifest(path).servers["web"]
    assert web.transport == "sse" and web.tool_prefix("web") == "web-"
