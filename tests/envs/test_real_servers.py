"""ToolEnv and `python -m envs` against MCP servers nobody here wrote, run the way users run them.

  time        mcp-server-time (PyPI) from its own virtualenv, stdio
  memory      @modelcontextprotocol/server-memory (npm) through `npx`, stdio
  everything  @modelcontextprotocol/server-everything (npm) in streamableHttp mode, started here

tests/servers/install.sh installs them (CI runs it first); the session fixture runs it again
(a no-op when up to date), so a missing install is made, or fails loudly, instead of skipping.
"""
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mcp import Client, StdioServerParameters

from envs import ToolEnv
from envs.manifest import load_manifest
from rl_factory.types import ToolCall

pytestmark = [pytest.mark.anyio, pytest.mark.slow]  # third-party servers (npm's, PyPI's), some through the CLI
SERVERS = Path(__file__).resolve().parents[1] / "servers"
TIME_BIN = SERVERS / ".venv-time" / "bin" / "mcp-server-time"
EVERYTHING_JS = SERVERS / "node_modules" / "@modelcontextprotocol" / "server-everything" / "dist" / "index.js"
NAMES = ["time", "memory", "everything"]

# Per server: a call that succeeds (tool, arguments, text it must contain), one our schema check
# rejects, and one the server itself rejects.
CASES = {
    "time": {
        "ok": ("convert_time", {"source_timezone": "UTC", "time": "12:00", "target_timezone": "Asia/Tokyo"},
               '"time_difference": "+9.0h"'),
        "bad_arguments": ("convert_time", {"source_timezone": "UTC", "time": "12:00"}),
        "server_error": ("get_current_time", {"timezone": "Mars/Olympus_Mons"}, "Invalid timezone"),
    },
    "memory": {
        "ok": ("create_entities", {"entities": [{"name": "Ada", "entityType": "person",
                                                 "observations": ["wrote the first program"]}]}, '"name": "Ada"'),
        "bad_arguments": ("create_entities", {"entities": [{"name": "Ada"}]}),
        "server_error": ("add_observations", {"observations": [{"entityName": "Nobody", "contents": ["x"]}]},
                         "Entity with name Nobody not found"),
    },
    "everything": {
        "ok": ("get-sum", {"a": 2, "b": 3.5}, "The sum of 2 and 3.5 is 5.5."),
        "bad_arguments": ("get-sum", {"a": "two", "b": 3}),
        "server_error": ("get-resource-reference", {"resourceId": 1.5}, "Invalid resourceId: 1.5"),
    },
}


@pytest.fixture(scope="session")
def installed():
    # Always run: it is idempotent (a stamp check, ~0.1 s) and catches a stale install too.
    done = subprocess.run(["bash", str(SERVERS / "install.sh")], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, f"tests/servers/install.sh failed:\n{done.stdout}\n{done.stderr}"
    assert TIME_BIN.exists() and EVERYTHING_JS.exists()
    return SERVERS


@pytest.fixture(scope="module")
def everything_url(installed, tmp_path_factory):
    """server-everything's streamable HTTP mode on a free local port, for this module."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    log = open(tmp_path_factory.mktemp("everything") / "server.log", "wb")
    proc = subprocess.Popen(["node", str(EVERYTHING_JS), "streamableHttp"], env={**os.environ, "PORT": str(port)},
                            stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            assert proc.poll() is None and time.monotonic() < deadline, "server-everything did not start"
            time.sleep(0.1)
    yield f"http://127.0.0.1:{port}/mcp"
    proc.terminate()
    proc.wait(timeout=10)
    log.close()


@pytest.fixture(scope="module")
def write_manifests(installed, everything_url, write_manifest):
    """write_manifests(directory) -> {name: manifest path}; the memory server's file goes there too."""
    def write(directory: Path) -> dict[str, Path]:
        servers = {
            "time": {"command": str(TIME_BIN), "args": ["--local-timezone", "UTC"]},
            # As in a desktop client's config, but `--no` so that npx never downloads.
            "memory": {"command": "npx", "args": ["--no", "@modelcontextprotocol/server-memory"],
                       "cwd": str(installed), "env": {"MEMORY_FILE_PATH": str(directory / "memory.jsonl")}},
            "everything": {"url": everything_url},
        }
        return {name: write_manifest(directory, {name: spec}, name=f"{name}.yaml") for name, spec in servers.items()}
    return write


@pytest.fixture(scope="module")
def manifests(write_manifests, tmp_path_factory):
    return write_manifests(tmp_path_factory.mktemp("real"))


@pytest.fixture(scope="module")
async def envs(manifests):
    opened = {name: ToolEnv.from_manifest(path) for name, path in manifests.items()}
    for env in opened.values():
        await env.__aenter__()
    try:
        for env in opened.values():
            await env.list_tools()
        yield opened
    finally:
        for env in opened.values():
            await env.__aexit__(None, None, None)


async def sdk_tools(manifest: Path) -> dict:
    """The server's own tool list, read with the bare MCP SDK client (none of our code)."""
    (spec,) = load_manifest(manifest).servers.values()
    target = spec.url or StdioServerParameters(command=spec.command, args=spec.args, env=spec.env, cwd=spec.cwd)
    async with Client(target, mode="legacy") as client:
        return {t.name: t for t in (await client.list_tools()).tools}


@pytest.mark.parametrize("name", NAMES)
async def test_tools_passed_through_unchanged(envs, manifests, name):
    expected = await sdk_tools(manifests[name])
    schemas = envs[name].tools
    assert [s["function"]["name"] for s in schemas] == list(expected)
    for schema in schemas:
        tool = expected[schema["function"]["name"]]
        assert schema == {"type": "function", "function": {
            "name": tool.name, "description": tool.description or "", "parameters": tool.input_schema}}


@pytest.mark.parametrize("name", NAMES)
async def test_calls(envs, name):
    case = CASES[name]
    ok, bad, failing = await envs[name].call_batch([
        ToolCall(case["ok"][0], case["ok"][1]),
        ToolCall(*case["bad_arguments"]),
        ToolCall(case["server_error"][0], case["server_error"][1])])
    assert ok.ok and case["ok"][2] in ok.text, ok.text
    assert bad.error_kind == "bad_arguments" and bad.text.startswith("Error: invalid arguments"), bad.text
    assert failing.error_kind == "server_error" and case["server_error"][2] in failing.text, failing.text


@pytest.fixture
def cli(tmp_path, repo_root):
    def run(*args) -> subprocess.CompletedProcess:
        env = {**os.environ, "PYTHONPATH": str(repo_root)}
        return subprocess.run([sys.executable, "-m", "envs", *map(str, args)], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=120)
    return run


@pytest.mark.parametrize("name", NAMES)
def test_cli_list_and_call(cli, write_manifests, tmp_path, name):
    manifest = write_manifests(tmp_path)[name]  # a fresh memory file: the entity is new again
    out = cli("list", manifest)
    assert out.returncode == 0, out.stderr
    tool, arguments, expected = CASES[name]["ok"]
    assert f"[{name}] {tool}: " in out.stdout
    out = cli("call", manifest, tool, json.dumps(arguments))
    assert out.returncode == 0 and expected in out.stdout, out.stdout + out.stderr
