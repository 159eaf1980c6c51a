"""ToolEnv against real MCP servers (the calculator and tests/fakes/slow_server.py) as subprocesses."""
import asyncio
import re
import os
import subprocess
import sys
import time
from pathlib import Path
from unittest import mock

import pytest
from mcp.types import CallToolResult, ImageContent, ResourceLink, TextContent

from envs import ToolEnv, ToolEnvError, ToolLimits, get_parser
from envs.servers.calculator import build_server
from envs.tool_env import render_result
from rl_factory.types import ToolCall
from tests.fakes.net import free_port, wait_for_port

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
async def env(tmp_path_factory, write_manifest, slow_server):
    """Calculator + slow server, started once; no PYTHONPATH in our env and an unrelated cwd, so
    the calculator only imports because the manifest puts the project root on its PYTHONPATH."""
    tmp = tmp_path_factory.mktemp("env")
    path = write_manifest(tmp, {
        "calculator": {"command": "python", "args": ["-m", "envs.servers.calculator"], "cwd": str(tmp)},
        "slow": slow_server(timeout_s=0.5)})
    with mock.patch.dict(os.environ):
        os.environ.pop("PYTHONPATH", None)
        # These tests batch many calls to test concurrency, not a model's turn: lift the per-turn cap.
        tool_env = ToolEnv.from_manifest(path, log_dir=tmp / "logs", limits=ToolLimits(max_calls_per_turn=64))
    async with tool_env:
        await tool_env.list_tools()
        yield tool_env


async def test_tools_are_mcp_schemas_unchanged(env):
    (expected,) = await build_server().list_tools()
    calculator = next(t for t in env.tools if t["function"]["name"] == "calculator")
    assert calculator == {"type": "function", "function": {
        "name": "calculator", "description": expected.description, "parameters": expected.input_schema}}
    assert env.tool_names == ["calculator", "sleep", "crash", "pid", "fail"]
    assert env.server_of("sleep") == "slow"


async def test_call_batch_runs_concurrently(env):
    calls = [ToolCall("calculator", {"expression": f"{i} * {i}"}) for i in range(50)]
    results = await env.call_batch(calls)
    assert [r.text for r in results] == [str(i * i) for i in range(50)]
    assert all(r.ok and r.server == "calculator" for r in results)
    start = time.perf_counter()
    results = await env.call_batch([ToolCall("sleep", {"seconds": 0.3})] * 50)
    assert all(r.ok for r in results) and time.perf_counter() - start < 3  # not 15 s sequential


async def test_failures_are_results(env):
    env.reset_metrics()
    calls = [
        ToolCall("calculator", {"expression": "2 + 3"}),
        ToolCall("", None, raw="<tool_call>{bad</tool_call>", error="invalid JSON"),
        ToolCall("search", {"q": "x"}),
        ToolCall("calculator", {"expr": "1"}),
        ToolCall("calculator", {"expression": 12}),
        ToolCall("sleep", {"seconds": 5}),
        ToolCall("calculator", {"expression": "1 / 0"}),
        ToolCall("fail", {"message": "boom"}),
    ]
    results = await env.call_batch(calls)
    assert [r.error_kind for r in results] == [None, "parse", "unknown_tool", "bad_arguments",
                                               "bad_arguments", "timeout", "server_error", "server_error"]
    ok, parse, unknown, missing, wrong_type, timeout, div, fail = results
    assert ok.text == "5"
    assert parse.text == "Error: could not parse the tool call: invalid JSON"
    assert unknown.text.startswith("Error: unknown tool 'search'; available tools: calculator, sleep")
    assert missing.text == "Error: invalid arguments for 'calculator': 'expression' is a required property"
    assert wrong_type.text == ("Error: invalid arguments for 'calculator' at 'expression': "
                               "12 is not of type 'string'")
    assert timeout.text == "Error: tool 'sleep' timed out after 0.5s" and 0.4 < timeout.latency_s < 2
    assert div.text == "Error executing tool calculator: division by zero"
    assert fail.text == "Error executing tool fail: boom"
    assert (await env.call(ToolCall("sleep", {"seconds": 0.01}))).ok  # usable after a timeout

    metrics = env.metrics()
    assert metrics["tool/calls"] == 9 and metrics["tool/success_rate"] == pytest.approx(2 / 9)
    assert metrics["tool/calculator/calls"] == 4 and metrics["tool/calculator/errors/bad_arguments"] == 2
    assert metrics["tool/_invalid/errors/unknown_tool"] == 1 and metrics["tool/_invalid/errors/parse"] == 1
    assert metrics["tool/sleep/errors/timeout"] == 1 and metrics["tool/errors/server_error"] == 2
    assert 0 < metrics["tool/latency_s/mean"] < metrics["tool/latency_s/max"]
    env.reset_metrics()
    assert env.metrics() == {"tool/calls": 0.0}



async def test_tool_metrics_alone_counts_what_the_env_counted(env):
    """envs.tool_metrics holds the counting: the real results of a batch, recorded into a fresh ToolMetrics
    with the env's tool names, give the env's own metrics (no episodes here: tool/* keys only)."""
    from envs.tool_env import INVALID_TOOL_KEY, LOCAL_ERROR_KINDS  # still importable from the env
    from envs.tool_metrics import ToolMetrics

    assert INVALID_TOOL_KEY == "_invalid" and "parse" in LOCAL_ERROR_KINDS
    env.reset_metrics()
    results = await env.call_batch([ToolCall("calculator", {"expression": "2 + 3"}), ToolCall("search", {"q": "x"}),
                                    ToolCall("calculator", {"expr": "1"}), ToolCall("fail", {"message": "boom"})])
    counted = ToolMetrics()
    for result in results:
        counted.record(result, env.tool_names)
    assert not env.episodic and counted.metrics() == env.metrics()
    assert counted.metrics()["tool/_invalid/errors/unknown_tool"] == 1 and "tool/latency_s/max" in counted.metrics()
    counted.reset()
    assert counted.metrics() == {"tool/calls": 0.0}


TURNS = {
    "hermes": ('<tool_call>\n{"name": "calculator", "arguments": {"expression": "1+1"}\n</tool_call>',
               '<tool_call>\n{"name": "calculator", "arguments": {"expression": "6*7"}}\n</tool_call>'),
    "qwen3_xml": ("<tool_call>\n<function calculator>\n</tool_call>",
                  "<tool_call>\n<function=calculator>\n<parameter=expression>\n6*7\n</parameter>\n"
                  "</function>\n</tool_call>"),
}


@pytest.mark.parametrize("parser", sorted(TURNS))
async def test_malformed_call_does_not_stop_the_good_one(env, parser):
    bad, good = TURNS[parser]
    _, calls = get_parser(parser, tools=env.tools).parse(f"I'll compute.\n{bad}\n{good}<|im_end|>")
    results = await env.call_batch(calls)
    assert [r.error_kind for r in results] == ["parse", None]
    assert results[0].text.startswith("Error: could not parse the tool call:") and results[1].text == "42"


async def test_crashed_server_fails_fast_then_restarts(tmp_path, write_manifest, slow_server):
    async with ToolEnv.from_manifest(write_manifest(tmp_path, {"slow": slow_server()})) as env:
        first_pid = (await env.call(ToolCall("pid", {}))).text
        crashed = await env.call_batch([ToolCall("crash", {}), ToolCall("sleep", {"seconds": 2})])
        assert [r.error_kind for r in crashed] == ["crashed", "crashed"]
        assert crashed[0].text.startswith("Error: tool server 'slow' crashed")
        restarted = await env.call(ToolCall("pid", {}))  # the next call restarts the server
        assert restarted.ok and restarted.text != first_pid
        assert env.metrics()["tool/errors/crashed"] == 2


async def test_exit_leaves_no_child_process(tmp_path, write_manifest, slow_server):
    async with ToolEnv.from_manifest(write_manifest(tmp_path, {"slow": slow_server()})) as env:
        pid = int((await env.call(ToolCall("pid", {}))).text)
        os.kill(pid, 0)  # alive while the env is open
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


async def test_duplicate_tool_names_both_servers(tmp_path, write_manifest, slow_server):
    path = write_manifest(tmp_path, {"a": slow_server(tools={"include": ["pid"]}),
                                     "b": slow_server(tools={"exclude": ["crash"]})})
    with pytest.raises(ToolEnvError, match="tool 'pid' is served by both 'a' and 'b'"):
        async with ToolEnv.from_manifest(path) as env:
            await env.list_tools()


@pytest.mark.parametrize("log_dir", [None, "logs"])
async def test_server_that_cannot_start(tmp_path, write_manifest, log_dir):
    path = write_manifest(tmp_path, {"broken": {"command": "python", "args": ["-m", "envs.servers.nope"]}})
    with pytest.raises(ToolEnvError, match=r"MCP server 'broken' .* failed to start: (.|\n)*No module named"):
        async with ToolEnv.from_manifest(path, log_dir=log_dir and tmp_path / log_dir) as env:
            await asyncio.wait_for(env.list_tools(), 60)  # the stderr tail is read back from the log


@pytest.mark.parametrize("log_dir", [None, "logs"])
async def test_a_server_that_cannot_start_is_quoted_by_whole_lines_and_its_log_is_named(tmp_path, write_manifest,
                                                                                        log_dir):
    """A long stderr line, then a traceback whose last line is long too (mcp 2.x's FastMCP hint): the error
    quotes the last lines whole, the exception and its hint included, and names a log file that holds it all."""
    script = tmp_path / "server.py"
    script.write_text("import sys\nprint('starting ' + 'x' * 3000, file=sys.stderr)\n"
                      "for i in range(30):\n    print(f'noise {i}', file=sys.stderr)\n"
                      "from mcp.server.fastmcp import FastMCP\n")
    path = write_manifest(tmp_path, {"old_api": {"command": "python", "args": [str(script)]}})
    with pytest.raises(ToolEnvError) as err:
        async with ToolEnv.from_manifest(path, log_dir=log_dir and tmp_path / log_dir) as env:
            await asyncio.wait_for(env.list_tools(), 60)
    first, where, *quoted = str(err.value).split("\n")
    assert first.startswith("MCP server 'old_api' (") and "failed to start" in first
    assert len(quoted) == 20 and all(line.startswith("    ") for line in quoted)
    assert quoted[0] == "    noise 16" and quoted[-7] == "    noise 29" and quoted[-6] == "    Traceback (most recent call last):"
    assert quoted[-1].startswith("    ModuleNotFoundError: No module named 'mcp.server.fastmcp'")
    assert quoted[-1].endswith("or pin 'mcp<2' to keep running v1 code.")  # the hint, whole
    log = Path(re.search(r"\(all of it: (.*)\):$", where).group(1))
    assert log.is_absolute() and "x" * 3000 in log.read_text() and quoted[-1].strip() in log.read_text()
    if log_dir:
        assert log == (tmp_path / log_dir / "old_api.log").resolve()


async def test_streamable_http_server_with_tool_filter(tmp_path, write_manifest, slow_server):
    port = free_port()
    script = slow_server()["args"][0]
    proc = subprocess.Popen([sys.executable, script, "--transport", "streamable-http", "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        await wait_for_port(port)
        path = write_manifest(tmp_path, {"web": {"url": f"http://127.0.0.1:{port}/mcp",
                                                 "tools": {"include": ["sleep", "pid"]}}})
        async with ToolEnv.from_manifest(path) as env:
            await env.list_tools()
            assert env.tool_names == ["sleep", "pid"]
            results = await env.call_batch([ToolCall("sleep", {"seconds": 0.1})] * 10)
            assert [r.text for r in results] == ["slept 0.1"] * 10
            proc.kill()
            proc.wait()
            assert (await env.call(ToolCall("pid", {}))).error_kind == "crashed"
    finally:
        proc.kill()
        proc.wait()


async def test_empty_env():
    env = ToolEnv.from_manifest(None)
    async with env:
        assert env.tools == []
        result = await env.call(ToolCall("calculator", {"expression": "1"}))
    assert result.error_kind == "unknown_tool"
    assert result.text == "Error: unknown tool 'calculator'; no tools are available"
    assert (await ToolEnv.empty().call_batch([])) == []


def test_render_result_non_text_content():
    result = CallToolResult(content=[
        TextContent(type="text", text="see"),
        ImageContent(type="image", data="AAAA", mime_type="image/png"),
        ResourceLink(type="resource_link", name="r", uri="file:///tmp/r.txt")])
    assert render_result(result) == "see\n[image: image/png]\n[resource: file:///tmp/r.txt]"
    assert render_result(CallToolResult(content=[], structured_content={"result": 5})) == '{"result": 5}'


# ---- lazy start, prefixes, restart policy ------------------------------------------------------

def marked_pids(marker: str) -> set[int]:
    """Live processes whose environment carries RLF_TEST_MARK=<marker>."""
    pids = set()
    for proc in os.listdir("/proc"):
        try:
            if proc.isdigit() and f"RLF_TEST_MARK={marker}".encode() in open(f"/proc/{proc}/environ", "rb").read():
                pids.add(int(proc))
        except OSError:
            continue
    return pids


async def test_lazy_start_happens_once(tmp_path, write_manifest, slow_server):
    marker = f"lazy-{os.getpid()}-{time.monotonic_ns()}"
    path = write_manifest(tmp_path, {"slow": slow_server(env={"RLF_TEST_MARK": marker})})
    async with ToolEnv.from_manifest(path, limits=ToolLimits(max_calls_per_turn=20)) as env:
        await asyncio.sleep(0.2)
        assert marked_pids(marker) == set()  # entering starts nothing
        with pytest.raises(RuntimeError, match="list_tools"):
            env.tools
        # Many first calls at once: one server, started once.
        results = await env.call_batch([ToolCall("pid", {})] * 20)
        assert len({r.text for r in results}) == 1 and all(r.ok for r in results)
        assert marked_pids(marker) == {int(results[0].text)}
        assert [t["function"]["name"] for t in await env.list_tools()] == env.tool_names
    assert marked_pids(marker) == set()


async def test_failed_start_is_reported_to_every_first_caller_once(tmp_path, write_manifest):
    path = write_manifest(tmp_path, {"broken": {"command": "python", "args": ["-m", "envs.servers.nope"]}})
    async with ToolEnv.from_manifest(path, log_dir=tmp_path / "logs") as env:
        outcomes = await asyncio.gather(*(env.call(ToolCall("x", {})) for _ in range(10)), return_exceptions=True)
    assert all(isinstance(o, ToolEnvError) and "MCP server 'broken'" in str(o) for o in outcomes)
    assert (tmp_path / "logs" / "broken.log").read_text().count("No module named") == 1  # started once


async def test_no_manifest_starts_nothing_and_calls_need_async_with(tmp_path, write_manifest, slow_server):
    async with ToolEnv.from_manifest(None) as env:
        assert await env.list_tools() == [] and env.tools == []
    with pytest.raises(RuntimeError, match="async with"):
        await ToolEnv.from_manifest(write_manifest(tmp_path, {"slow": slow_server()})).list_tools()


async def test_prefix_namespaces_servers_and_routes_back(tmp_path, write_manifest, slow_server):
    path = write_manifest(tmp_path, {"a": slow_server(prefix=True, tools={"include": ["pid", "sleep"]}),
                                     "b": slow_server(prefix="other", tools={"include": ["pid"]})})
    async with ToolEnv.from_manifest(path) as env:
        assert [t["function"]["name"] for t in await env.list_tools()] == ["a__sleep", "a__pid", "other__pid"]
        a, b, bare = await env.call_batch([ToolCall("a__pid", {}), ToolCall("other__pid", {}), ToolCall("pid", {})])
        assert a.ok and b.ok and a.text != b.text and (a.server, b.server) == ("a", "b")
        assert bare.error_kind == "unknown_tool" and "a__sleep, a__pid, other__pid" in bare.text
        assert (await env.call(ToolCall("a__sleep", {"seconds": 0.01}))).text == "slept 0.01"
        assert env.metrics()["tool/a__pid/calls"] == 1


async def test_restart_never(tmp_path, write_manifest, slow_server):
    async with ToolEnv.from_manifest(write_manifest(tmp_path, {"slow": slow_server(restart="never")})) as env:
        assert (await env.call(ToolCall("crash", {}))).error_kind == "crashed"
        after = await env.call(ToolCall("pid", {}))
        assert after.error_kind == "crashed" and "not restarted (restart: never)" in after.text


async def test_restart_gives_up_after_max_restarts_in_a_row(tmp_path, write_manifest, slow_server):
    policy = {"max_restarts": 2, "backoff_s": 0, "max_backoff_s": 0}
    async with ToolEnv.from_manifest(write_manifest(tmp_path, {"slow": slow_server(restart=policy)})) as env:
        first = await env.call(ToolCall("pid", {}))
        crashes = [await env.call(ToolCall("crash", {})) for _ in range(3)]  # the start, then 2 restarts
        assert [r.error_kind for r in crashes] == ["crashed"] * 3
        after = await env.call(ToolCall("pid", {}))
        assert "gave up after 2 restarts in a row" in after.text
        assert first.ok


async def test_restart_backoff_fails_fast_then_restarts(tmp_path, write_manifest, slow_server):
    policy = {"backoff_s": 1.0, "max_backoff_s": 1.0}
    async with ToolEnv.from_manifest(write_manifest(tmp_path, {"slow": slow_server(restart=policy)})) as env:
        await env.call(ToolCall("crash", {}))
        await env.call(ToolCall("crash", {}))  # restarted at once, crashed again: now 1 s of backoff
        start = time.perf_counter()
        waiting = await env.call(ToolCall("pid", {}))
        assert waiting.error_kind == "crashed" and "restarting in" in waiting.text
        assert time.perf_counter() - start < 0.5  # failed fast, did not wait out the backoff
        await asyncio.sleep(1.1)
        assert (await env.call(ToolCall("pid", {}))).ok
