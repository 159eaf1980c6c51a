"""What the Python sandbox's code can reach of the host: sockets, devices, memory, files, the GPU.

One test per way out found by an adversarial review; each is real code run through a real server
over ToolEnv, and each check looks from outside where it can (a listener that must stay silent, the
kernel log, the host's /proc, the result text). Namespaces mode only (the default): process mode
lacks all of this, and its tool description says so (tests/envs/test_python_sandbox.py).
"""
import asyncio
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import pytest

from envs import ToolEnv, ToolEnvError
from envs.servers.isolation import ENGINES
from envs.servers.probe import probe_namespaces
from rl_factory.types import ToolCall

pytestmark = [pytest.mark.anyio,
              pytest.mark.skipif(probe_namespaces() is not None, reason="namespaces mode is not available here")]
SANDBOX = ["-m", "envs.servers.python_sandbox", "--memory-mb", "256", "--cpu-seconds", "5", "--timeout-s", "20"]
# Both engines of namespaces mode where this machine has them (bwrap: Debian's bubblewrap, see .ci/run).
AVAILABLE = [e for e in ENGINES[1:] if probe_namespaces(engine=e) is None]
MINIMAL_DEV = ["fd", "null", "random", "shm", "stderr", "stdin", "stdout", "urandom", "zero"]


def server(*args: str, **extra) -> dict:
    return {"command": "python", "args": [*SANDBOX, *args], "timeout_s": 60, "restart": "never", **extra}


@pytest.fixture(scope="module", params=AVAILABLE)
def engine(request) -> str:
    return request.param


@pytest.fixture(scope="module")
async def env(tmp_path_factory, write_manifest, engine):
    path = write_manifest(tmp_path_factory.mktemp("view"), {"sandbox": server("--engine", engine)})
    async with ToolEnv.from_manifest(path) as tool_env:
        await tool_env.list_tools()
        yield tool_env


async def run(env, code: str) -> str:
    (result,) = await env.call_batch([ToolCall("run_python", {"code": code})])
    assert result.ok, result.text
    return result.text


@pytest.fixture
def host_dir(repo_root):
    """A directory of the host outside /tmp (the sandbox's /tmp is its own): inside the project."""
    path = Path(tempfile.mkdtemp(prefix=".sandbox-host-", dir=repo_root))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def run_dir():
    """A directory under /run (where docker, containerd, dbus and databases keep their sockets)."""
    path = Path(tempfile.mkdtemp(prefix="rlf-sandbox-", dir="/run" if os.access("/run", os.W_OK) else None))
    yield path
    shutil.rmtree(path, ignore_errors=True)


async def test_no_unix_socket_of_the_host_is_reachable(env, host_dir, run_dir):
    abstract = f"\0rlf-sandbox-{uuid.uuid4().hex}"
    listeners = []
    for address in (str(run_dir / "daemon.sock"), str(host_dir / "db.sock"), abstract):
        listener = socket.socket(socket.AF_UNIX)
        listener.bind(address)
        listener.listen()
        listener.setblocking(False)
        listeners.append((address, listener))
    code = ("import socket\n"
            f"for address in {[a for a, _ in listeners]!r}:\n"
            "    s = socket.socket(socket.AF_UNIX)\n    s.settimeout(3)\n"
            "    try:\n        s.connect(address)\n        s.sendall(b'GET /')\n        print('connected')\n"
            "    except OSError as err:\n        print('refused', err.errno)\n")
    try:
        text = await run(env, code)
        for address, listener in listeners:
            with pytest.raises(BlockingIOError):
                listener.accept()  # nothing ever reached the listener
    finally:
        for _, listener in listeners:
            listener.close()
    # the paths do not exist in the sandbox's view (ENOENT); the abstract name is the network namespace's own
    assert text.splitlines() == ["refused 2", "refused 2", "refused 111", "[exit code 0]"]


def kernel_log() -> str:
    fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
    records = []
    try:
        while True:
            try:
                records.append(os.read(fd, 8192).decode(errors="replace"))
            except BlockingIOError:
                return "".join(records)
            except OSError:  # EPIPE: a record was overwritten while reading; keep going
                continue
    finally:
        os.close(fd)


async def test_no_device_node_of_the_host_can_be_opened(env):
    marker = f"rlf-sandbox-{uuid.uuid4().hex}"
    code = ("import os, stat\n"
            "for path, flags in (('/dev/kmsg', os.O_WRONLY), ('/dev/loop-control', os.O_RDWR),\n"
            "                    ('/dev/vda', os.O_RDONLY)):\n"
            "    try:\n        fd = os.open(path, flags)\n"
            f"        if path == '/dev/kmsg':\n            os.write(fd, b'{marker}\\n')\n"
            "        print('opened', path)\n"
            "    except OSError as err:\n        print('refused', path, err.errno)\n"
            "try:\n    os.mknod('/tmp/kmsg', stat.S_IFCHR | 0o666, os.makedev(1, 11))\n    print('made a node')\n"
            "except OSError as err:\n    print('mknod refused', err.errno)\n"
            "print(sorted(os.listdir('/dev')))\n")
    text = await run(env, code)
    for _ in range(20 if os.access("/dev/kmsg", os.R_OK) else 0):  # checked from the host: nothing reached
        assert marker not in kernel_log()  # the kernel log (which may lag a write)
        await asyncio.sleep(0.1)
    lines = text.splitlines()
    assert lines[:3] == ["refused /dev/kmsg 2", "refused /dev/loop-control 2", "refused /dev/vda 2"]
    assert lines[3] == "mknod refused 1" and lines[4] == repr(MINIMAL_DEV)


async def test_the_code_runs_as_an_unprivileged_user(env):
    marker = f"rlfu{uuid.uuid4().hex[:8]}"
    code = (f"import os, time\nopen('/proc/self/comm', 'w').write({marker!r})\n"
            "print(open('/proc/self/status').read().split('CapEff:')[1].split()[0])\ntime.sleep(3)")
    task = asyncio.create_task(run(env, code))
    uids = None
    for _ in range(200):  # the host's view of the code's process: its real and effective uids
        await asyncio.sleep(0.02)
        for entry in Path("/proc").iterdir():
            try:
                if entry.name.isdigit() and (entry / "comm").read_text().strip() == marker:
                    uids = next(line.split()[1:] for line in (entry / "status").read_text().splitlines()
                                if line.startswith("Uid:"))
            except OSError:
                continue
        if uids:
            break
    text = await task
    assert uids is not None and "0" not in uids  # not root on the host, whatever it is called inside
    assert text.splitlines()[0] == "0000000000000000"  # and no capability


async def test_memory_held_in_memfds_counts_against_the_limit(tmp_path, write_manifest, engine):
    path = write_manifest(tmp_path, {"sandbox": server("--memory-mb", "64", "--engine", engine)})
    # 512 MiB in 64 memfds of 8 MiB (each under RLIMIT_FSIZE), none of it in the address space
    code = ("import os\nchunk = b'x' * (1 << 20)\nfds = []\n"
            "for i in range(64):\n    fds.append(os.memfd_create('x'))\n"
            "    for _ in range(8):\n        os.write(fds[-1], chunk)\n"
            "print('held', 8 * len(fds), 'MiB', flush=True)\n")
    async with ToolEnv.from_manifest(path) as tool_env:
        (tool,) = await tool_env.list_tools()
        text = await run(tool_env, code)
    if "no memory cgroup here" in tool["function"]["description"]:  # disclosed, not claimed
        assert "held 512 MiB" in text
        pytest.skip("no memory cgroup on this host (the tool description says the limit does not cover memfds)")
    assert text == "[no output]\n[killed: memory limit of 64 MB exceeded]"


async def test_the_host_files_are_not_visible(env, host_dir, repo_root):
    secret = f"sk-dataset-answer-{uuid.uuid4().hex}"
    answers = host_dir / "answers.jsonl"  # stands for the training answers and the reward's source
    answers.write_text(secret)
    paths = [str(answers), str(repo_root / "rewards"), "/etc/shadow", "/root", "/home", "/run", "/var/run",
             "/sys", str(Path.home())]
    code = ("import os\n"
            f"for path in {paths!r}:\n"
            "    try:\n        print(open(path).read() if os.path.isfile(path) else os.listdir(path))\n"
            "    except OSError as err:\n        print('missing', err.errno)\n")
    text = await run(env, code)
    assert secret not in text
    lines = text.splitlines()
    assert lines[:3] == ["missing 2"] * 3 and lines[4:8] == ["missing 2"] * 4
    # /root and the home directory exist only as the path to the interpreter (here under /root/.pyenv)
    for line in (lines[3], lines[8]):
        assert line == "missing 2" or line in ("['.pyenv']", "['.local']", "['.cache']")


async def test_an_interpreter_under_tmp_works(tmp_path, write_manifest, engine):
    venv = Path(tempfile.mkdtemp(prefix="rlf-sandbox-venv-", dir="/tmp"))
    venv.chmod(0o755)  # mkdtemp's 0700 would keep out the code's user (nobody, when the server is root)
    try:
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
        python = str(venv / "bin" / "python")
        path = write_manifest(tmp_path, {"sandbox": server("--python", python, "--engine", engine)})
        async with ToolEnv.from_manifest(path) as tool_env:
            await tool_env.list_tools()
            text = await run(tool_env, "import os, sys\nprint(sys.prefix)\nprint(sorted(os.listdir('/tmp')))")
        assert text.splitlines() == [str(venv), repr([venv.name]), "[exit code 0]"]  # its prefix: read-only
    finally:
        shutil.rmtree(venv, ignore_errors=True)


async def test_a_failure_names_its_real_cause(tmp_path, write_manifest, engine):
    missing = f"/nonexistent-{uuid.uuid4().hex[:6]}/bin/python"
    path = write_manifest(tmp_path, {"sandbox": server("--python", missing, "--engine", engine)})
    with pytest.raises(ToolEnvError) as info:
        async with ToolEnv.from_manifest(path) as tool_env:
            await tool_env.list_tools()
    assert missing in str(info.value) and "No such file or directory" in str(info.value)
    assert "user namespaces" not in str(info.value)


async def test_no_gpu_is_visible(env):
    code = ("import os\nprint(sorted(os.listdir('/dev')))\nprint(os.path.exists('/sys'))\n"
            "print(repr(os.environ['CUDA_VISIBLE_DEVICES']), os.environ['NVIDIA_VISIBLE_DEVICES'])")
    assert (await run(env, code)).splitlines() == [repr(MINIMAL_DEV), "False", "'' void", "[exit code 0]"]
