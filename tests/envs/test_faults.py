"""Fault tests against real server subprocesses (tests/fakes/fault_server.py): a server killed
mid-batch, hung tools, garbage on stdout, a command that does not exist.

Timings are measured with the env's own accounting (`ToolResult.latency_s`) or from the moment
of the fault, and the margins are generous enough for a loaded 2-core machine while still far
below what a hang or a retry would cost. The measured numbers are printed (`pytest -s`).
"""
import asyncio
import os
import signal
import subprocess
import sys
import time

import pytest

from envs import ToolEnv, ToolEnvError, ToolLimits
from rl_factory.types import ToolCall

pytestmark = pytest.mark.anyio


async def wait_for(predicate, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not await predicate():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.02)


async def test_server_killed_mid_batch(tmp_path, write_manifest, fault_server):
    path = write_manifest(tmp_path, {"faulty": fault_server(timeout_s=60)})
    async with ToolEnv.from_manifest(path, limits=ToolLimits(max_calls_per_turn=20)) as env:
        pid = int((await env.call(ToolCall("pid", {}))).text)
        batch = asyncio.ensure_future(env.call_batch([ToolCall("sleep", {"seconds": 30})] * 20))

        async def all_in_flight() -> bool:
            return (await env.call(ToolCall("inflight", {}))).text == "20"
        await wait_for(all_in_flight)
        killed_at = time.perf_counter()
        os.kill(pid, signal.SIGKILL)
        results = await asyncio.wait_for(batch, 10)
        after_kill_s = time.perf_counter() - killed_at
        print(f"\nkill -> all 20 in-flight calls returned errors in {after_kill_s * 1000:.0f} ms")
        assert [r.error_kind for r in results] == ["crashed"] * 20
        assert all(r.text.startswith("Error: tool server 'faulty' crashed") for r in results)
        assert after_kill_s < 1.0

        restarted = await env.call(ToolCall("pid", {}))  # the next call restarts the server
        assert restarted.ok and int(restarted.text) != pid
        assert (await env.call(ToolCall("sleep", {"seconds": 0.01}))).ok
        assert env.metrics()["tool/sleep/errors/crashed"] == 20


@pytest.mark.parametrize("tool, arguments", [("hang", {}), ("block", {"seconds": 30})])
async def test_hung_tool_times_out_on_time(tmp_path, write_manifest, fault_server, tool, arguments):
    timeout_s = 2.0
    path = write_manifest(tmp_path, {"faulty": fault_server(timeout_s=timeout_s)})
    async with ToolEnv.from_manifest(path) as env:
        await env.list_tools()
        results = await env.call_batch([ToolCall(tool, arguments)] * 5)
        ratios = [r.latency_s / timeout_s for r in results]
        print(f"\n{tool}: timeout_s={timeout_s}, latency/timeout = {min(ratios):.3f}..{max(ratios):.3f}")
        assert [r.error_kind for r in results] == ["timeout"] * 5
        assert results[0].text == f"Error: tool '{tool}' timed out after 2s"
        assert all(1.0 <= ratio <= 1.1 for ratio in ratios), ratios
        assert (await env.call(ToolCall("pid", {}))).ok  # the session outlives its timeouts


async def test_frozen_server_times_out_then_recovers(tmp_path, write_manifest, fault_server):
    """A server that stops answering altogether (SIGSTOP) costs each call its timeout, no more."""
    path = write_manifest(tmp_path, {"faulty": fault_server(timeout_s=1.0)})
    async with ToolEnv.from_manifest(path) as env:
        pid = int((await env.call(ToolCall("pid", {}))).text)
        os.kill(pid, signal.SIGSTOP)
        try:
            results = await env.call_batch([ToolCall("pid", {})] * 3)
        finally:
            os.kill(pid, signal.SIGCONT)
        assert [r.error_kind for r in results] == ["timeout"] * 3
        assert all(1.0 <= r.latency_s <= 1.1 for r in results), [r.latency_s for r in results]
        assert (await env.call(ToolCall("pid", {}))).text == str(pid)


async def test_garbage_on_stdout(tmp_path, write_manifest, fault_server):
    path = write_manifest(tmp_path, {"faulty": fault_server("--banner", timeout_s=5)})
    async with ToolEnv.from_manifest(path) as env:
        assert "noisy" in [t["function"]["name"] for t in await env.list_tools()]  # banner survived
        pid = (await env.call(ToolCall("pid", {}))).text
        noisy = await asyncio.wait_for(env.call_batch([ToolCall("noisy", {"text": f"n{i}"}) for i in range(5)]), 30)
        # Each call either answers or is an error result; none hangs or raises.
        assert all(r.ok and r.text == f"n{i}" or r.error_kind for i, r in enumerate(noisy)), noisy
        assert sum(r.ok for r in noisy) == 5
        after = await env.call_batch([ToolCall("sleep", {"seconds": 0.05})] * 5 + [ToolCall("pid", {})])
        assert all(r.ok for r in after) and after[-1].text == pid  # same process: nothing crashed


@pytest.mark.parametrize("log_dir", [None, "logs"])
async def test_command_that_does_not_exist(tmp_path, write_manifest, log_dir):
    path = write_manifest(tmp_path, {"ghost": {"command": "rlf-no-such-command-xyz", "args": ["--serve"]}})
    env = ToolEnv.from_manifest(path, log_dir=log_dir and tmp_path / log_dir)
    with pytest.raises(ToolEnvError, match=r"MCP server 'ghost' \(rlf-no-such-command-xyz --serve\) failed to "
                                           r"start: .*No such file or directory"):
        async with env:
            await asyncio.wait_for(env.list_tools(), 60)


def test_cli_names_the_server_whose_command_does_not_exist(tmp_path, write_manifest, repo_root):
    path = write_manifest(tmp_path, {"ghost": {"command": "rlf-no-such-command-xyz"}})
    out = subprocess.run([sys.executable, "-m", "envs", "list", str(path)], cwd=tmp_path, capture_output=True,
                         text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(repo_root)})
    assert out.returncode == 2
    assert "MCP server 'ghost'" in out.stderr and "rlf-no-such-command-xyz" in out.stderr
    assert "Traceback" not in out.stderr and len(out.stderr.splitlines()) == 1
