"""Plain Python functions as tools: schemas from hints and docstrings, sync off the event loop,
async awaited, and the same errors, timeouts and metrics as MCP tools."""
import asyncio
import os
import subprocess
import sys
import time

import pytest

from envs import ToolEnv, ToolEnvError
from envs.functions import parse_docstring
from envs.manifest import ManifestError
from rl_factory.types import ToolCall

pytestmark = pytest.mark.anyio

TOOLS = '''
import asyncio
import threading
import time

from pydantic import BaseModel


class Point(BaseModel):
    x: int
    y: int


def add(a: int, b: int = 2) -> int:
    """Add two integers.

    Args:
        a: The first addend.
        b (int): The second addend, which
            defaults to two.

    Returns:
        The sum.
    """
    return a + b


async def shout(text: str) -> str:
    """Upper-case `text`."""
    await asyncio.sleep(0.01)
    return text.upper()


def where() -> str:
    """The thread this runs on."""
    return threading.current_thread().name


def boom(message: str) -> str:
    """Always fails."""
    raise ValueError(message)


def nap(seconds: float) -> str:
    """Block for `seconds`."""
    time.sleep(seconds)
    return "rested"


def norm(p: Point) -> float:
    """Length of a point."""
    return (p.x ** 2 + p.y ** 2) ** 0.5


def pid() -> str:
    """Clashes with the slow server's tool of the same name."""
    return "local"
'''


@pytest.fixture
def manifest(tmp_path):
    (tmp_path / "my_tools.py").write_text(TOOLS)
    path = tmp_path / "tools.yaml"
    path.write_text("functions:\n" + "".join(f"  - my_tools.py:{name}\n" for name in
                                              ["add", "shout", "where", "boom", "norm"])
                    + "  - {function: my_tools.py:nap, timeout_s: 1.0}\n"
                    + "  - envs.servers.calculator:evaluate\n")
    return path


async def test_schemas_from_hints_and_docstrings(manifest):
    async with ToolEnv.from_manifest(manifest) as env:
        tools = {t["function"]["name"]: t["function"] for t in await env.list_tools()}
    assert list(tools) == ["add", "shout", "where", "boom", "norm", "nap", "evaluate"]
    assert tools["add"] == {"name": "add", "description": "Add two integers.", "parameters": {
        "type": "object", "title": "addArguments", "required": ["a"], "properties": {
            "a": {"title": "A", "type": "integer", "description": "The first addend."},
            "b": {"title": "B", "type": "integer", "default": 2,
                  "description": "The second addend, which defaults to two."}}}}
    assert tools["norm"]["parameters"]["properties"]["p"] == {"$ref": "#/$defs/Point"}
    assert env.server_of("add") == "functions"


async def test_calls_errors_and_metrics(manifest):
    async with ToolEnv.from_manifest(manifest) as env:
        add, shout, where, boom, norm, bad, calc = await env.call_batch([
            ToolCall("add", {"a": 3}), ToolCall("shout", {"text": "hi"}), ToolCall("where", {}),
            ToolCall("boom", {"message": "no luck"}), ToolCall("norm", {"p": {"x": 3, "y": 4}}),
            ToolCall("add", {"a": "three"}), ToolCall("evaluate", {"expression": "1/0"})])
        metrics = env.metrics()
    assert (add.text, shout.text, norm.text) == ("5", "HI", "5.0")
    assert where.text.startswith("tool-where")  # a thread of its own, not the event loop's
    assert boom.error_kind == "server_error" and boom.text == "Error executing tool boom: ValueError: no luck"
    assert bad.error_kind == "bad_arguments" and "'three' is not of type 'integer'" in bad.text
    assert calc.error_kind == "server_error" and "division by zero" in calc.text
    assert metrics["tool/boom/errors/server_error"] == 1 and metrics["tool/add/calls"] == 2
    assert metrics["tool/success_rate"] == pytest.approx(4 / 7)


async def test_sync_function_runs_off_the_loop_and_times_out(manifest):
    async with ToolEnv.from_manifest(manifest) as env:
        await env.list_tools()
        start = time.perf_counter()
        naps = asyncio.ensure_future(env.call_batch([ToolCall("nap", {"seconds": 0.5})] * 4))
        await asyncio.sleep(0.05)
        assert (await env.call(ToolCall("shout", {"text": "x"}))).ok
        assert time.perf_counter() - start < 0.4  # answered while the four naps were blocking
        assert [r.text for r in await naps] == ["rested"] * 4
        hung = await env.call(ToolCall("nap", {"seconds": 30}))
    assert hung.error_kind == "timeout" and hung.text == "Error: tool 'nap' timed out after 1s"
    assert 1.0 <= hung.latency_s <= 1.1, hung.latency_s


async def test_functions_next_to_servers(tmp_path, slow_server, write_manifest):
    (tmp_path / "my_tools.py").write_text(TOOLS)
    path = write_manifest(tmp_path, {"slow": slow_server(tools={"include": ["sleep", "pid"]})})
    text = path.read_text() + "functions: [my_tools.py:add]\n"
    path.write_text(text)
    async with ToolEnv.from_manifest(path) as env:
        assert [t["function"]["name"] for t in await env.list_tools()] == ["sleep", "pid", "add"]
        slept, added = await env.call_batch([ToolCall("sleep", {"seconds": 0.01}), ToolCall("add", {"a": 1})])
        assert (slept.text, slept.server, added.text, added.server) == ("slept 0.01", "slow", "3", "functions")
    path.write_text(text.replace("[my_tools.py:add]", "[my_tools.py:pid]"))
    with pytest.raises(ToolEnvError, match="tool 'pid' is served by both 'slow' and function 'my_tools.py:pid'"):
        async with ToolEnv.from_manifest(path) as env:
            await env.list_tools()


@pytest.mark.parametrize("entry, message", [
    ("missing.py:f", "functions[0] ('missing.py:f'): file not found: missing.py"),
    ("my_tools.py:nope", "functions[0] ('my_tools.py:nope'): 'my_tools.py' has no function 'nope'"),
    ("no_such_pkg_xyz.mod:f", "cannot import 'no_such_pkg_xyz.mod': ModuleNotFoundError"),
    ("my_tools.py", "functions[0].function: expected 'package.module:function'"),
    ("broken.py:f", "cannot import 'broken.py': SyntaxError"),
])
def test_bad_function_entries_name_the_entry(tmp_path, entry, message):
    (tmp_path / "my_tools.py").write_text(TOOLS)
    (tmp_path / "broken.py").write_text("def f(:\n")
    path = tmp_path / "tools.yaml"
    path.write_text(f"functions: ['{entry}']\n")
    with pytest.raises(ManifestError) as info:
        ToolEnv.from_manifest(path)
    assert str(info.value).startswith(str(path)) and message in str(info.value)


def test_parse_docstring():
    doc = "Search the web.\n\nMore detail.\n\nArgs:\n    query: What to look for.\n    k (int, optional): How many\n" \
          "        results.\n    **kw: Extra.\n\nRaises:\n    ValueError: never an argument.\n"
    assert parse_docstring(doc) == ("Search the web.\n\nMore detail.",
                                    {"query": "What to look for.", "k": "How many results.", "kw": "Extra."})
    assert parse_docstring("") == ("", {})


def test_cli_lists_functions(manifest, repo_root):
    out = subprocess.run([sys.executable, "-m", "envs", "list", str(manifest)], capture_output=True, text=True,
                         timeout=60, cwd="/", env={**os.environ, "PYTHONPATH": str(repo_root)})
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[0] == "[functions] add: Add two integers."


def test_module_functions_import_from_the_manifests_repository(tmp_path, repo_root):
    """Like a stdio server's PYTHONPATH: "pkg.module:fn" resolves in the manifest's git repository."""
    (tmp_path / ".git").mkdir()
    (tmp_path / "rlf_pkg_tools").mkdir()
    (tmp_path / "rlf_pkg_tools" / "__init__.py").write_text("")
    (tmp_path / "rlf_pkg_tools" / "mod.py").write_text(TOOLS)
    (tmp_path / "configs").mkdir()
    manifest = tmp_path / "configs" / "tools.yaml"
    manifest.write_text("functions: [rlf_pkg_tools.mod:add]\n")
    out = subprocess.run([sys.executable, "-m", "envs", "call", str(manifest), "add", '{"a": 40}'],
                         capture_output=True, text=True, timeout=60, cwd="/",
                         env={**os.environ, "PYTHONPATH": str(repo_root)})
    assert (out.returncode, out.stdout) == (0, "42\n"), out.stderr
