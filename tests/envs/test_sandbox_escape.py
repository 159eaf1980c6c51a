"""The Python sandbox against code written to escape it (the default isolation, namespaces, for real).

Every attack is real code run through a real server over ToolEnv; the checks look at the host from
outside (its files, its /proc, the server's open file descriptors), never at what the code reports
about itself. Processes the tests look for are marked through /proc/self/comm, which any process
may set on itself. The last test starts the server where user namespaces are forbidden (inside a
user namespace whose `max_user_namespaces` is 0, as under Docker's default seccomp profile): it
must refuse to start and say what would be missing, unless the manifest names the weaker mode.
"""
import asyncio
import os
import shutil
import socket
import sys
import tempfile
import uuid
from pathlib import Path

import pytest

from envs import ToolEnv, ToolEnvError
from envs.servers.isolation import ENGINES
from envs.servers.probe import probe_namespaces
from rl_factory.types import ToolCall
from tests.envs.sandbox_view import sandbox_tmp_listing

pytestmark = pytest.mark.anyio
NAMESPACES_WORK = probe_namespaces() is None
needs_namespaces = pytest.mark.skipif(not NAMESPACES_WORK, reason="user namespaces are not available here "
                                      "(the server refuses to start: see the last test)")
# Both engines of namespaces mode where this machine has them (bwrap: Debian's bubblewrap, see .ci/run).
AVAILABLE = [e for e in ENGINES[1:] if probe_namespaces(engine=e) is None] or ["unshare"]
SANDBOX = ["-m", "envs.servers.python_sandbox", "--memory-mb", "256", "--cpu-seconds", "5", "--timeout-s", "20"]


@pytest.fixture(scope="module")
def listed(repo_root):
    """A host directory the manifest lists with --ro-path (outside /tmp: the sandbox's /tmp is its own)."""
    path = Path(tempfile.mkdtemp(prefix=".sandbox-listed-", dir=repo_root))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module", params=AVAILABLE)
async def env(tmp_path_factory, write_manifest, listed, request):
    path = write_manifest(tmp_path_factory.mktemp("escape"), {
        "sandbox": {"command": "python", "args": [*SANDBOX, "--ro-path", str(listed), "--engine", request.param],
                    "timeout_s": 60,
                    "env": {"RLF_SERVER_SECRET": SERVER_SECRET}}})
    async with ToolEnv.from_manifest(path) as tool_env:
        await tool_env.list_tools()
        yield tool_env


SERVER_SECRET = "sk-server-" + uuid.uuid4().hex


async def run(env, code: str) -> str:
    (result,) = await env.call_batch([ToolCall("run_python", {"code": code})])
    assert result.ok, result.text
    return result.text


def marked(marker: str) -> list[int]:
    """Host pids whose comm is `marker`."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and (entry / "comm").read_text().strip() == marker:
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def server_fds() -> int:
    """Open fds of our sandbox server process (the stdio child of this test process)."""
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and b"envs.servers.python_sandbox" in (entry / "cmdline").read_bytes() \
                    and int((entry / "stat").read_text().split()[3]) == os.getpid():
                return len(os.listdir(entry / "fd"))
        except OSError:
            continue
    raise AssertionError("sandbox server process not found")


@pytest.fixture
def host_dir(repo_root):
    """A directory of the host outside /tmp (the sandbox's /tmp is its own): inside the project."""
    path = Path(tempfile.mkdtemp(prefix=".sandbox-target-", dir=repo_root))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@needs_namespaces
@pytest.mark.parametrize("where", ["listed", "unlisted"])
async def test_the_host_is_read_only(env, host_dir, listed, where):
    tmp_path = listed if where == "listed" else host_dir
    target = tmp_path / f"reward_{uuid.uuid4().hex[:6]}.py"  # stands for the reward file and the project tree
    target.write_text("def reward(**_): return 0.0\n")
    os.chmod(tmp_path, 0o777)
    os.chmod(target, 0o666)
    code = (f"import pathlib\nt = pathlib.Path({str(target)!r})\n"
            "for attempt in (lambda: t.write_text('def reward(**_): return 1.0'),\n"
            "                lambda: (t.parent / 'planted.py').write_text('x'),\n"
            "                lambda: t.unlink()):\n"
            "    try:\n        attempt()\n        print('wrote')\n"
            "    except OSError as err:\n        print('refused', err.errno)\n")
    text = await run(env, code)
    assert target.read_text() == "def reward(**_): return 0.0\n" and not (tmp_path / "planted.py").exists()
    # a path the manifest lists is there, read-only (EROFS); any other is not there at all (ENOENT)
    assert text.splitlines()[:3] == ["refused 30" if where == "listed" else "refused 2"] * 3
    # ... while its own /tmp is writable, private and gone afterwards
    assert await run(env, "open('/tmp/x', 'w').write('ok')\nprint(open('/tmp/x').read())") == "ok\n[exit code 0]"
    assert await run(env, "import os\nprint(os.listdir('/tmp'))") == f"{sandbox_tmp_listing()}\n[exit code 0]"


@needs_namespaces
async def test_a_run_cannot_see_or_kill_a_sibling_run(env):
    marker = f"rlfv{uuid.uuid4().hex[:8]}"
    victim = (f"import time\nopen('/proc/self/comm', 'w').write({marker!r})\n"
              "time.sleep(4)\nprint('survived')")
    attacker = ("import os, signal, time\ntime.sleep(1.5)\nfound = 0\n"
                "for pid in filter(str.isdigit, os.listdir('/proc')):\n"
                "    try:\n"
                f"        if open(f'/proc/{{pid}}/comm').read().strip() == {marker!r}:\n"
                "            found += 1\n            os.kill(int(pid), signal.SIGKILL)\n"
                "    except OSError:\n        pass\n"
                "print('found', found)")
    victim_result, attacker_result = await asyncio.gather(run(env, victim), run(env, attacker))
    assert attacker_result.startswith("found 0") and victim_result == "survived\n[exit code 0]"


@needs_namespaces
async def test_a_forked_setsid_child_dies_with_its_run(env):
    marker = f"rlfo{uuid.uuid4().hex[:8]}"
    code = ("import os, time\n"
            "if os.fork() == 0:\n    os.setsid()\n"
            f"    open('/proc/self/comm', 'w').write({marker!r})\n"
            "    time.sleep(60)\n    os._exit(0)\n"
            "time.sleep(0.5)\nprint('parent done')")
    await run(env, "pass")  # the server's steady state before counting its fds
    fds_before = server_fds()
    for _ in range(3):
        assert await run(env, code) == "parent done\n[exit code 0]"
    await asyncio.sleep(0.5)
    assert marked(marker) == []  # no orphan outlives its call
    assert server_fds() == fds_before  # and none holds a pipe of the server open


@needs_namespaces
async def test_process_and_file_size_limits(env):
    fork_bomb = ("import os, time\nfor i in range(500):\n    try:\n        pid = os.fork()\n"
                 "    except OSError as err:\n        print('fork refused after', i, err.errno)\n        break\n"
                 "    if pid == 0:\n        time.sleep(30)\n        os._exit(0)\nelse:\n    print('forked 500')")
    (tool,) = env.tools
    if "not enforced" in tool["function"]["description"]:  # root without a writable pids cgroup: said so
        pytest.skip("the process cap is not enforceable here (root without a pids cgroup)")
    text = await run(env, fork_bomb)
    assert text.startswith("fork refused after") and int(text.split()[3]) < 64 and " 11\n" in text  # EAGAIN
    big_file = ("try:\n    open('/tmp/big', 'wb').write(b'x' * (32 << 20))\n    print('wrote')\n"
                "except OSError as err:\n    print('refused', err.errno)")
    assert await run(env, big_file) == "refused 27\n[exit code 0]"  # EFBIG: RLIMIT_FSIZE


@needs_namespaces
async def test_no_inherited_environment_and_no_other_process_visible(env):
    code = ("import os\nprint(sorted(k for k in os.environ if 'SECRET' in k))\nleaks = 0\n"
            "for pid in filter(str.isdigit, os.listdir('/proc')):\n"
            "    try:\n"
            f"        leaks += {SERVER_SECRET!r}.encode() in open(f'/proc/{{pid}}/environ', 'rb').read()\n"
            "    except OSError:\n        pass\n"
            "print('leaks', leaks)\nprint(os.getppid(), sorted(filter(str.isdigit, os.listdir('/proc')), key=int)[:3])")
    lines = (await run(env, code)).splitlines()
    assert lines[0] == "[]" and lines[1] == "leaks 0"
    # its parent is the namespace's init (unshare engine) or, under bwrap, RUNNER's waiting half below
    # bwrap's init; nothing else exists
    assert lines[2] in ("1 ['1', '2']", "2 ['1', '2', '3']")


@needs_namespaces
async def test_no_network_even_through_the_low_level_socket_module(env):
    with socket.create_server(("127.0.0.1", 0)) as listener:
        listener.setblocking(False)
        port = listener.getsockname()[1]
        code = ("import _socket\ns = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM)\ns.settimeout(3)\n"
                f"try:\n    s.connect(('127.0.0.1', {port}))\n    print('connected')\n"
                "except OSError as err:\n    print('refused', err.errno)")
        text = await run(env, code)
        with pytest.raises(BlockingIOError):
            listener.accept()  # nothing ever reached the listener
    assert text.startswith("refused")


async def test_refuses_to_start_without_namespaces_unless_the_weaker_mode_is_named(tmp_path, write_manifest):
    # A user namespace in which no further user namespace may be created: what Docker's default
    # seccomp profile (or kernel.unprivileged_userns_clone=0) leaves a server with.
    def no_userns(*args: str) -> dict:
        if not NAMESPACES_WORK:  # this machine already is one
            return {"command": "python", "args": list(args), "timeout_s": 60, "restart": "never"}
        script = f"echo 0 > /proc/sys/user/max_user_namespaces && exec {sys.executable} {' '.join(args)}"
        return {"command": "unshare", "args": ["--user", "--map-root-user", "sh", "-c", script],
                "timeout_s": 60, "restart": "never"}

    strict = write_manifest(tmp_path, {"sandbox": no_userns(*SANDBOX)}, name="strict.yaml")
    with pytest.raises(ToolEnvError) as info:
        async with ToolEnv.from_manifest(strict) as env:
            await env.list_tools()
    message = str(info.value)
    assert "--isolation namespaces is not available here" in message
    assert "no pid namespace" in message and "--isolation process" in message

    weak = write_manifest(tmp_path, {"sandbox": no_userns(*SANDBOX, "--isolation", "process")}, name="weak.yaml")
    async with ToolEnv.from_manifest(weak) as env:
        (tool,) = await env.list_tools()
        assert "Isolation: process only (weaker; missing: no pid namespace" in tool["function"]["description"]
        assert await run(env, "print(6 * 7)") == "42\n[exit code 0]"
