"""What one tool can cost, for every kind of source: output bytes, startup time, a SystemExit, secrets.

A tool returning 32 MiB is dropped while it is read (stdio, streamable HTTP, SSE) or cut (a function),
in seconds and without holding it in memory, and fails only its own call; a result over
`max_output_bytes` keeps its head and tail; an SSE server that never sends its endpoint event fails
within `startup_timeout_s`; `SystemExit` in a function tool is an error result, not the end of the
trainer; a key echoed in a successful result or on a server's stderr never reaches the rollouts or
tool_logs.
"""
import asyncio
import json
import os
import subprocess
import sys
import time

import pytest

from envs import ToolEnv, ToolEnvError, ToolLimits
from rl_factory.types import ToolCall
from tests.fakes.hostile_http import hostile_server
from tests.fakes.net import free_port, wait_for_port

pytestmark = pytest.mark.anyio
SECRET = "sk-live-" + "7c1e9a24b3d8"
FUNCTIONS = '''
import argparse
import sys


def parse_flags(flags: str) -> str:
    """A tool built on argparse: a bad flag makes argparse call sys.exit(2)."""
    parser = argparse.ArgumentParser(prog="tool")
    parser.add_argument("--count", type=int)
    return str(parser.parse_args(flags.split()).count)


def quits(code: int) -> str:
    """Calls exit() like a script."""
    exit(code)


async def quits_async(code: int) -> str:
    """An async tool that raises SystemExit."""
    raise SystemExit(code)


def huge(mib: int) -> str:
    """A text of `mib` MiB."""
    return "y" * (mib << 20)
'''


def rss_mib() -> float:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS")) / 1024


async def test_a_32_mib_stdio_result_is_dropped_while_read(tmp_path, write_manifest, fault_server):
    path = write_manifest(tmp_path, {"faulty": fault_server(timeout_s=120)})
    async with ToolEnv.from_manifest(path) as env:
        await env.list_tools()
        before, start = rss_mib(), time.perf_counter()
        result = await env.call(ToolCall("big", {"mib": 32}))
        seconds, grown = time.perf_counter() - start, rss_mib() - before
        print(f"\n32 MiB over stdio: {seconds:.2f} s, RSS +{grown:.0f} MiB -> {result.text[:90]!r}")
        assert result.error_kind == "too_large" and "byte limit" in result.text and len(result.text) < 500
        assert seconds < 20 and grown < 100
        # a result between max_output_bytes and the wire cap is kept as head + tail
        mid = await env.call(ToolCall("big", {"mib": 0.25}))
        assert mid.ok and len(mid.text.encode()) < 66_000 and "bytes truncated ...]" in mid.text
        assert (await env.call(ToolCall("pid", {}))).ok  # the connection survives
        assert env.metrics()["tool/errors/too_large"] == 1


@pytest.mark.parametrize("transport, path", [("streamable-http", "/mcp"), ("sse", "/sse")])
async def test_a_32_mib_http_or_sse_result_fails_only_its_own_call(tmp_path, write_manifest, repo_root,
                                                                   transport, path):
    port = free_port()
    server = subprocess.Popen([sys.executable, str(repo_root / "tests" / "fakes" / "fault_server.py"),
                               "--transport", transport, "--port", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        await wait_for_port(port)
        spec = {"url": f"http://127.0.0.1:{port}{path}", "transport": transport.replace("-", "_"), "timeout_s": 120}
        async with ToolEnv.from_manifest(write_manifest(tmp_path, {"web": spec})) as env:
            pid = (await env.call(ToolCall("pid", {}))).text
            before, start = rss_mib(), time.perf_counter()
            # One call's oversized answer shares the connection (SSE: one event stream) with the others.
            big, *siblings = await env.call_batch([ToolCall("big", {"mib": 32}), ToolCall("pid", {}),
                                                   ToolCall("sleep", {"seconds": 0.1})])
            seconds, grown = time.perf_counter() - start, rss_mib() - before
            print(f"\n32 MiB over {transport}: {seconds:.2f} s, RSS +{grown:.0f} MiB -> {big.text[:90]!r}")
            assert big.error_kind == "too_large" and "byte limit" in big.text and len(big.text) < 500
            assert [s.ok for s in siblings] == [True, True], siblings
            assert seconds < 20 and grown < 100
            after = await env.call(ToolCall("pid", {}))
            assert after.ok and after.text == pid  # the same connection, not a restart
            assert env.metrics()["tool/errors/too_large"] == 1 and "tool/errors/crashed" not in env.metrics()
    finally:
        server.kill()
        server.wait()


async def test_sse_framing_keeps_only_the_head_of_an_oversized_event():
    from envs.transports import sse_events

    big = b'{"jsonrpc": "2.0", "id": 7, "result": "' + b"z" * 5000 + b'"}'
    wire = (b": ping\r\n\r\nevent: endpoint\r\ndata: /messages/?session_id=1\r\n\r\n"
            b"data: {\"a\":\ndata: 1}\n\n" b"data: " + big + b"\r\n\r\n" b"data:\r\n\r\n")

    async def chunks():  # split anywhere, CR and LF apart included
        for i in range(0, len(wire), 7):
            yield wire[i:i + 7]

    events = [e async for e in sse_events(chunks(), limit=1024)]
    assert events[:2] == [("endpoint", b"/messages/?session_id=1", 23), ("message", b'{"a":\n1}', 8)]
    kind, head, size = events[2]
    assert kind == "message" and size == len(big) and head == big[:4096]  # the head names the request
    assert events[3] == ("message", b"", 0) and len(events) == 4  # a keep-alive


async def test_a_function_tools_32_mib_result_is_cut(tmp_path):
    (tmp_path / "tools.py").write_text(FUNCTIONS)
    async with ToolEnv.from_manifest({"functions": [f"{tmp_path}/tools.py:huge"]},
                                     limits=ToolLimits(max_output_bytes=4096)) as env:
        result = await env.call(ToolCall("huge", {"mib": 32}))
    assert result.ok and len(result.text.encode()) < 4200
    assert result.text.startswith("y" * 2048) and f"[... {(32 << 20) - 4096} bytes truncated ...]" in result.text


async def test_system_exit_in_a_function_tool_is_an_error_result(tmp_path):
    (tmp_path / "tools.py").write_text(FUNCTIONS)
    names = ["parse_flags", "quits", "quits_async"]
    async with ToolEnv.from_manifest({"functions": [f"{tmp_path}/tools.py:{n}" for n in names]}) as env:
        bad_flag, quit_sync, quit_async, good = await env.call_batch([
            ToolCall("parse_flags", {"flags": "--colour red"}), ToolCall("quits", {"code": 3}),
            ToolCall("quits_async", {"code": 4}), ToolCall("parse_flags", {"flags": "--count 5"})])
    assert good.ok and good.text == "5"
    for result, code in [(bad_flag, 2), (quit_sync, 3), (quit_async, 4)]:
        assert result.error_kind == "server_error" and f"SystemExit {code}" in result.text, result.text


async def test_an_sse_server_that_never_sends_its_endpoint_fails_within_the_startup_timeout(tmp_path, write_manifest):
    with hostile_server("sse_silent") as server:
        path = write_manifest(tmp_path, {"silent": {"url": server.url + "/sse", "transport": "sse",
                                                    "startup_timeout_s": 2}})
        start = time.perf_counter()
        with pytest.raises(ToolEnvError, match="startup_timeout_s=2s"):
            async with ToolEnv.from_manifest(path) as env:
                await asyncio.wait_for(env.list_tools(), 30)  # a hang fails the test rather than hangs it
        assert time.perf_counter() - start < 10


@pytest.mark.parametrize("pad", [65_546, 200_000 - 2])
async def test_a_secret_straddling_the_cut_of_a_long_stderr_line_is_scrubbed(tmp_path, write_manifest, fault_server,
                                                                           pad):
    os.environ["RLF_LIMITS_API_KEY"] = SECRET
    try:
        path = write_manifest(tmp_path, {"faulty": fault_server(env={"SERVICE_KEY": "${RLF_LIMITS_API_KEY}"})})
        async with ToolEnv.from_manifest(path, log_dir=tmp_path / "tool_logs") as env:
            assert (await env.call(ToolCall("reveal_split", {"name": "SERVICE_KEY", "pad": pad}))).ok
        log = (tmp_path / "tool_logs" / "faulty.log").read_text()
        assert SECRET not in log and SECRET[:4] not in log and log.endswith("x" * 100 + "***\n")
        assert log.count("x") == pad
    finally:
        del os.environ["RLF_LIMITS_API_KEY"]


async def test_secrets_never_reach_results_rollouts_or_tool_logs(tmp_path, write_manifest, fault_server):
    from rl_factory.evaluate import write_rollouts
    from rl_factory.types import Trajectory, Turn

    os.environ["RLF_LIMITS_API_KEY"] = SECRET
    try:
        path = write_manifest(tmp_path, {"faulty": fault_server(env={"SERVICE_KEY": "${RLF_LIMITS_API_KEY}"})})
        async with ToolEnv.from_manifest(path, log_dir=tmp_path / "tool_logs") as env:
            result = await env.call(ToolCall("reveal", {"name": "SERVICE_KEY"}))
        assert result.ok and result.text == "the key is ***"
        log = (tmp_path / "tool_logs" / "faulty.log").read_text()
        assert "debug: SERVICE_KEY=***" in log and SECRET not in log
        traj = Trajectory(0, [1], [1], [0], [0.0], [{"role": "tool", "content": f"echo {SECRET}"}],
                          [Turn([1], [0.0], "t", tool_results=[result])], "answer",
                          reward_info={"reward_error": f"HTTP 401 for key {SECRET}"})
        write_rollouts(tmp_path / "rollouts.jsonl", [traj])
        text = (tmp_path / "rollouts.jsonl").read_text()
        assert SECRET not in text and json.loads(text)["messages"][0]["content"] == "echo ***"
    finally:
        del os.environ["RLF_LIMITS_API_KEY"]
