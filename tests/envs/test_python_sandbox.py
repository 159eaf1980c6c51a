"""The bundled Python sandbox server through ToolEnv: output, limits, isolation, clean-up.

Two servers with small limits: `fast` (the default isolation, namespaces; 1 s CPU, generous wall
time, so a CPU-bound loop can only be stopped by RLIMIT_CPU) and `stub` (the weaker `process` mode,
named in its args, 2 s wall time). tests/envs/test_sandbox_escape.py attacks the isolation itself.
"""
import asyncio
import os
import socket
import time

import pytest
from mcp import Client

from envs import ToolEnv
from envs.servers.capture import Capture
from envs.servers.probe import probe_namespaces
from envs.servers.cgroups import RunCgroups
from envs.servers.python_sandbox import SandboxConfig, build_server, format_result, run_code
from rl_factory.types import ToolCall
from tests.envs.sandbox_view import sandbox_tmp_listing

pytestmark = pytest.mark.anyio
SANDBOX = ["-m", "envs.servers.python_sandbox", "--memory-mb", "256", "--max-output-bytes", "1000"]
# Where namespaces cannot be had (the server would refuse), `fast` runs in the weaker mode instead;
# tests/envs/test_sandbox_escape.py covers both the isolation and the refusal.
NAMESPACES = probe_namespaces() is None
FAST_MODE = [] if NAMESPACES else ["--isolation", "process"]


@pytest.fixture(scope="module")
async def envs(tmp_path_factory, write_manifest):
    tmp = tmp_path_factory.mktemp("sandbox")
    manifests = {
        "fast": {"command": "python", "args": [*SANDBOX, *FAST_MODE, "--cpu-seconds", "1", "--timeout-s", "30"],
                 "timeout_s": 60},
        "stub": {"command": "python", "args": [*SANDBOX, "--isolation", "process", "--timeout-s", "2"],
                 "timeout_s": 60},
    }
    opened = {}
    for name, spec in manifests.items():
        opened[name] = ToolEnv.from_manifest(write_manifest(tmp, {name: spec}, name=f"{name}.yaml"))
        await opened[name].__aenter__()
    try:
        for env in opened.values():
            await env.list_tools()
        yield opened
    finally:
        for env in opened.values():
            await env.__aexit__(None, None, None)


@pytest.fixture(scope="module")
def env(envs):
    return envs["fast"]


async def run(env, code: str):
    (result,) = await env.call_batch([ToolCall("run_python", {"code": code})])
    assert result.ok, result.text  # the code's own failures are results, not tool errors
    return result


async def test_description_names_limits_and_isolation(envs):
    (fast,), (stub,) = envs["fast"].tools, envs["stub"].tools
    expected = ("no network, no files of the host but the interpreter's" if NAMESPACES
                else "Isolation: process only")
    assert expected in fast["function"]["description"]
    assert "Isolation: process only (weaker; missing: no pid namespace" in stub["function"]["description"]
    assert "1 s CPU time, 256 MB " in fast["function"]["description"]
    assert ("30 s wall clock, 1000 bytes of output per stream, 64 processes, "
            "16 MB per file") in fast["function"]["description"]
    assert fast["function"]["parameters"]["required"] == ["code"]


async def test_prints_and_exit_status(env):
    assert (await run(env, "print('hello')\nprint(2 + 3)")).text == "hello\n5\n[exit code 0]"
    assert (await run(env, "pass")).text == "[no output]\n[exit code 0]"
    result = await run(env, "import sys\nprint('out')\nprint('err', file=sys.stderr)\nsys.exit(3)")
    assert result.text == "out\n[stderr]\nerr\n[exit code 3]"


async def test_exception_traceback(env):
    result = await run(env, "x = 1\ny = x / 0\n")
    assert result.text == ("[stderr]\nTraceback (most recent call last):\n"
                           '  File "<code>", line 2, in <module>\n    y = x / 0\n        ~~^~~\n'
                           "ZeroDivisionError: division by zero\n[exit code 1]")
    result = await run(env, "def f(:\n  pass")
    assert 'File "<code>", line 1' in result.text and "SyntaxError" in result.text


async def test_cpu_limit_kills_busy_loop(env):
    start = time.perf_counter()
    result = await run(env, "print('spinning', flush=True)\nwhile True: pass")
    assert result.text == "spinning\n[killed: CPU time limit of 1 s exceeded]"
    assert time.perf_counter() - start < 15  # far below the 30 s wall timeout


async def test_memory_limit(env):
    result = await run(env, "x = bytearray(64 << 20)\nprint(len(x) >> 20)\ny = bytearray(2 << 30)")
    assert result.text.startswith("64\n[stderr]\nTraceback") and result.text.endswith("MemoryError\n[exit code 1]")


async def test_wall_timeout(envs):
    start = time.perf_counter()
    result = await run(envs["stub"], "import time\nprint('sleeping', flush=True)\ntime.sleep(100)")
    assert result.text == "sleeping\n[killed: wall-clock timeout of 2 s]"
    assert time.perf_counter() - start < 10


@pytest.mark.parametrize("mode", ["fast", "stub"])
async def test_network_blocked(envs, mode):
    with socket.create_server(("127.0.0.1", 0)) as listener:
        listener.setblocking(False)
        port = listener.getsockname()[1]
        code = ("import socket\ntry:\n"
                f"    socket.create_connection(('127.0.0.1', {port}), timeout=5)\n"
                "    print('connected')\nexcept OSError as err:\n    print('blocked:', err)\n"
                "try:\n"
                f"    socket.socket().connect(('127.0.0.1', {port}))\n"
                "    print('connected')\nexcept OSError as err:\n    print('blocked:', err)\n")
        result = await run(envs[mode], code)
        with pytest.raises(BlockingIOError):
            listener.accept()  # nothing ever reached the listener
    lines = result.text.splitlines()
    assert [line.split(":")[0] for line in lines] == ["blocked", "blocked", "[exit code 0]"]
    if mode == "stub":
        assert lines[0] == "blocked: [Errno 13] network access is disabled in this sandbox"


async def test_stub_keeps_local_sockets_working(envs):
    code = "import asyncio\nasync def f():\n    return 42\nprint(asyncio.run(f()))"
    assert (await run(envs["stub"], code)).text == "42\n[exit code 0]"


async def test_fresh_workdir_per_call_removed_after(envs):
    code = ("import os\nprint(os.getcwd())\nprint(sorted(os.listdir('.')))\n"
            "open('leftover.txt', 'w').write('x')\nos.mkdir('sub')\nos.chmod('sub', 0)")
    if NAMESPACES:  # each run's /tmp is its own tmpfs (same path, never the same files)
        results = await envs["fast"].call_batch([ToolCall("run_python", {"code": code})] * 3)
        assert [r.text for r in results] == [f"/tmp\n{sandbox_tmp_listing()}\n[exit code 0]"] * 3
    # process: a new host temporary directory per run, deleted afterwards
    results = await envs["stub"].call_batch([ToolCall("run_python", {"code": code})] * 3)
    cwds = [r.text.splitlines()[0] for r in results]
    assert len(set(cwds)) == 3
    for result, cwd in zip(results, cwds):
        assert result.text.splitlines()[1:] == ["[]", "[exit code 0]"]
        assert not os.path.exists(cwd)


async def test_output_truncated_with_marker(env):
    # 5004 bytes of stdout, 1000 kept: the first 500 and the last 500 (where errors usually are).
    result = await run(env, "print('a' * 5000 + 'END')")
    assert result.text.split("\n") == ["a" * 500, "[... 4004 bytes truncated ...]", "a" * 496 + "END",
                                       "[exit code 0]"]


async def test_structured_content():
    cfg = SandboxConfig(cpu_seconds=2, timeout_s=10, max_output_bytes=100, isolation="process")
    async with Client(build_server(cfg)) as client:
        result = await client.call_tool("run_python", {"code": "import sys\nprint('x' * 300)\nsys.exit(2)"})
    data = result.structured_content
    assert (data["status"], data["exit_code"], data["stdout_truncated"], data["stderr"]) == ("error", 2, True, "")
    assert "[... 201 bytes truncated ...]" in data["stdout"] and not result.is_error


async def test_cancelled_run_leaves_no_process(tmp_path):
    pid_file = tmp_path / "pid"
    code = f"import os, time\nopen({str(pid_file)!r}, 'w').write(str(os.getpid()))\ntime.sleep(60)"
    task = asyncio.create_task(run_code(code, SandboxConfig(timeout_s=30, isolation="process")))
    for _ in range(100):
        await asyncio.sleep(0.05)
        if pid_file.exists() and pid_file.read_text():
            break
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    pid = int(pid_file.read_text())
    for _ in range(40):  # killed at once; reaping may take a moment
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        await asyncio.sleep(0.05)
    pytest.fail(f"sandbox process {pid} outlived its cancelled call")


def test_capture_keeps_head_and_tail():
    capture = Capture(10)
    for chunk in (b"01234", b"56789"):
        capture.add(chunk)
    assert (capture.text(), capture.truncated) == ("0123456789", False)
    capture.add(b"abc")
    assert capture.text() == "01234\n[... 3 bytes truncated ...]\n89abc"


MEMFD_HOG = ("import os\nchunk = b'x' * (1 << 20)\nfds = []\n"
             "for i in range(32):\n    fds.append(os.memfd_create('x'))\n"
             "    for _ in range(8):\n        os.write(fds[-1], chunk)\n"
             "print('held', 8 * len(fds), 'MiB')\n")


async def test_process_mode_caps_memory_outside_the_address_space_too():
    cgroup = RunCgroups.find()
    if not cgroup.has("memory"):
        pytest.skip("no memory cgroup can be created here")
    cfg = SandboxConfig(isolation="process", memory_mb=64, cgroup=cgroup)
    result = await run_code(MEMFD_HOG, cfg)  # 256 MiB in memfds, none of it in the address space
    assert (result.status, result.stdout) == ("memory_limit", "")
    assert format_result(result, cfg) == "[no output]\n[killed: memory limit of 64 MB exceeded]"


def test_without_a_memory_cgroup_the_description_says_what_is_not_capped():
    cfg = SandboxConfig(memory_mb=256, cgroup=RunCgroups({}), isolation="process")
    assert ("256 MB address space per process (memory held in memfds, shared memory or files is not capped: "
            "no memory cgroup here)") in cfg.describe()
    assert "256 MB memory (all the run holds)" in SandboxConfig(memory_mb=256, cgroup=RunCgroups.find()).describe() \
        or not RunCgroups.find().has("memory")
