"""envs.servers.stdio.run_stdio: the SDK's stdio transport fed from asyncio pipes, not threads."""
import asyncio
import os
import tempfile

import pytest

from envs import ToolEnv, ToolLimits
from envs.servers.stdio import _is_pipe
from rl_factory.types import ToolCall

pytestmark = pytest.mark.anyio

SERVER = '''
from mcp.server.mcpserver import MCPServer
from envs.servers.stdio import run_stdio

server = MCPServer("echo", log_level="WARNING")


@server.tool()
async def shout(text: str) -> str:
    print("stray output from a tool")  # must reach stderr, not the JSON-RPC wire
    return text.upper()


run_stdio(server)
'''


async def test_many_calls_big_lines_and_stray_prints(tmp_path, write_manifest):
    (tmp_path / "echo_server.py").write_text(SERVER)
    path = write_manifest(tmp_path, {"echo": {"command": "python", "args": [str(tmp_path / "echo_server.py")]}})
    big = "x" * 200_000  # one request line far past asyncio's default 64 KiB line limit
    async with ToolEnv.from_manifest(path, log_dir=tmp_path / "logs", limits=ToolLimits(max_calls_per_turn=101, max_output_bytes=256_000)) as env:
        results = await env.call_batch([ToolCall("shout", {"text": f"hi {i}"}) for i in range(100)]
                                       + [ToolCall("shout", {"text": big})])
    assert [r.text for r in results[:100]] == [f"HI {i}" for i in range(100)]
    assert results[100].text == big.upper()
    assert "stray output from a tool" in (tmp_path / "logs" / "echo.log").read_text()


def test_only_pipes_and_sockets_take_the_fast_path():
    read_fd, write_fd = os.pipe()
    with tempfile.TemporaryFile() as regular:
        assert _is_pipe(read_fd) and _is_pipe(write_fd)
        assert not _is_pipe(regular.fileno())  # files (and terminals) fall back to server.run()
    os.close(read_fd)
    os.close(write_fd)


async def test_logs_move_into_a_directory_once_the_run_may_write(tmp_path, write_manifest):
    """Started with anonymous logs, then `log_to`: what the server wrote before and after lands in the
    directory's log, after what an earlier run left there; nothing is written before."""
    (tmp_path / "echo_server.py").write_text(SERVER)
    path = write_manifest(tmp_path, {"echo": {"command": "python", "args": [str(tmp_path / "echo_server.py")]}})
    logs = tmp_path / "run" / "tool_logs"
    async with ToolEnv.from_manifest(path) as env:
        assert (await env.call(ToolCall("shout", {"text": "before"}))).text == "BEFORE"
        assert not (tmp_path / "run").exists()
        logs.mkdir(parents=True)
        (logs / "echo.log").write_text("an earlier run's line\n")
        env.log_to(logs)
        env.log_to(logs)  # again: nothing copied twice
        assert (await env.call(ToolCall("shout", {"text": "after"}))).text == "AFTER"
    lines = (logs / "echo.log").read_text().splitlines()
    assert lines[0] == "an earlier run's line" and lines.count("stray output from a tool") == 2


async def test_per_episode_servers_logs_move_too(tmp_path, write_manifest):
    """`scope: episode` instances start with anonymous logs like the run's servers: `ToolEnv.log_to` moves
    the live and pooled ones (and places the ones started later) into the directory; nothing before."""
    (tmp_path / "echo_server.py").write_text(SERVER)
    path = write_manifest(tmp_path, {"echo": {"command": "python", "args": [str(tmp_path / "echo_server.py")],
                                              "scope": "episode", "pool": 1}})
    logs = tmp_path / "run" / "tool_logs"
    async with ToolEnv.from_manifest(path) as env:
        await env.list_tools()
        first = await env.open_episode({})  # the pooled instance
        assert (await first.call(ToolCall("shout", {"text": "before"}))).text == "BEFORE"
        await asyncio.sleep(0.2)
        assert not (tmp_path / "run").exists()
        env.log_to(logs)
        assert (await first.call(ToolCall("shout", {"text": "after"}))).text == "AFTER"
        async with env.episode({}) as second:  # the pool's replacement, started before log_to, or a new one
            assert (await second.call(ToolCall("shout", {"text": "later"}))).text == "LATER"
        await first.close()
    assert (logs / "echo.log").read_text().splitlines().count("stray output from a tool") == 3
