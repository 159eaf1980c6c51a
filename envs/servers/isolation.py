"""How the Python sandbox isolates one run: `namespaces` (the default) or, by name only, `process`.

`namespaces` holds against code written to escape. Each run is started as

    unshare --user --map-root-user --pid --fork --mount --net --mount-proc --kill-child -- python INIT

so it gets fresh user, pid, mount and network namespaces. INIT runs as pid 1 of the new pid
namespace, as root of the new user namespace (which maps to the server's own uid, nothing more):

  1. remounts every mount but its own /proc read-only (a read-only view of the host: the code can
     read what the server's user can, and write nothing of it: not the reward file, not the project);
  2. mounts fresh tmpfs on /tmp, /var/tmp and /dev/shm (private, size-capped, gone with the run);
  3. forks the code's process, which sets RLIMIT_CPU / AS / NPROC / FSIZE / NOFILE / CORE, drops
     every capability (bounding set and capset, plus no_new_privs, so neither exec nor a setuid
     binary gives them back) and execs the interpreter on the code;
  4. waits for it and writes its exit status to a pipe the server reads, then exits.

When pid 1 exits, or is killed at the deadline (SIGKILL to `unshare`'s process group; `--kill-child`
takes pid 1 with it), the kernel kills every process of the namespace: a `fork`+`setsid` child
cannot outlive its call, and no pipe it held stays open in the server. /proc is the namespace's own:
no other process (siblings, the server, the trainer and their environments) is visible, so none
can be read or signalled. There is no network, not even loopback. Needs `unshare` (util-linux)
and user namespaces (root, or `kernel.unprivileged_userns_clone=1`; Docker's default seccomp
profile forbids them).

The kernel does not apply RLIMIT_NPROC to processes of real uid 0, and the user namespace maps the
code to the server's uid. So when the server runs as root, each run also gets its own pids cgroup
(`PidsCgroup`, cgroup v1 `pids` or v2 with the controller delegated) capped at the same number of
processes; where none is writable the tool description says that the process cap is not enforced.

`process` is the weaker mode, for machines without namespaces, and is used only when the manifest
names it (`--isolation process`): a fresh process in a new session with the same rlimits, an empty
temporary directory, no inherited environment, and a socket stub; `MISSING_IN_PROCESS_MODE` lists
what it lacks, and the tool description says so.
"""
from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import time
from pathlib import Path

MODES = ("namespaces", "process")
UNSHARE = ["unshare", "--user", "--map-root-user", "--pid", "--fork", "--mount", "--net",
           "--propagation", "private", "--mount-proc", "--kill-child", "--"]
MISSING_IN_PROCESS_MODE = (
    "no pid namespace: the code can see the host's processes, signal those of the server's user and "
    "read their /proc (environment variables, API keys)",
    "no mount namespace: it can write whatever the server's user can (the reward file, the project)",
    "no network namespace: only a socket stub, which code can undo, keeps it off the network",
    "no namespace to tear down: a process that leaves the run's session outlives the call",
)

# pid 1 of the run's namespaces (argv[1]: JSON settings). Runs with -I -S: the standard library only.
INIT = r"""
import ctypes, json, os, re, resource, sys
cfg = json.loads(sys.argv[1])
status = os.fdopen(cfg["status_fd"], "w")
libc = ctypes.CDLL(None, use_errno=True)
def report(line):
    status.write(line + "\n")
    status.flush()
def mount(source, target, fstype, flags, data=None):
    enc = lambda s: None if s is None else s.encode()
    if libc.mount(enc(source), enc(target), enc(fstype), flags, enc(data)) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), target)
try:
    keep = {"nosuid": 2, "nodev": 4, "noexec": 8, "noatime": 1024, "nodiratime": 2048,
            "relatime": 1 << 21, "strictatime": 1 << 24}
    for line in open("/proc/self/mountinfo"):
        fields = line.split()
        point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4])
        if point == "/proc" or point.startswith("/proc/"):
            continue  # the namespace's own /proc (only its processes); the kernel guards what matters
        flags = 4096 | 32 | 1 | sum(keep.get(o, 0) for o in fields[5].split(","))  # BIND|REMOUNT|RDONLY
        try:
            mount(None, point, None, flags)
        except OSError as err:
            if not point.startswith(("/proc/", "/sys/")) and os.path.exists(point):
                raise
    for point, size in (("/tmp", cfg["tmp_bytes"]), ("/var/tmp", cfg["tmp_bytes"]), ("/dev/shm", 1 << 20)):
        if os.path.isdir(point):
            mount("tmpfs", point, "tmpfs", 2 | 4, "size=%d,mode=1777" % size)  # nosuid, nodev
except Exception as err:
    report("setup %s: %s" % (type(err).__name__, err))
    os._exit(0)
child = os.fork()
if child == 0:
    try:
        os.chdir("/tmp")
        for name, (soft, hard) in cfg["rlimits"].items():
            resource.setrlimit(getattr(resource, name), (soft, hard))
        last = int(open("/proc/sys/kernel/cap_last_cap").read())
        for cap in range(last + 1):
            libc.prctl(24, cap, 0, 0, 0)  # PR_CAPBSET_DROP: exec cannot grant them back
        if libc.prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
        header, data = (ctypes.c_uint32 * 2)(0x20080522, 0), (ctypes.c_uint32 * 6)()
        if libc.capset(header, data) != 0:
            raise OSError(ctypes.get_errno(), "capset")
        status.close()
        os.execve(cfg["argv"][0], cfg["argv"], cfg["env"])
    except BaseException as err:
        report("setup %s: %s" % (type(err).__name__, err))
        os._exit(127)
status_of = lambda st: "signal %d" % os.WTERMSIG(st) if os.WIFSIGNALED(st) else "exit %d" % os.WEXITSTATUS(st)
_, st = os.waitpid(child, 0)
report(status_of(st))
"""


def namespace_command(python: str, argv: list[str], env: dict[str, str], rlimits: dict[str, int],
                      tmp_bytes: int, status_fd: int) -> list[str]:
    """The command that runs `argv` (an interpreter and its arguments) in fresh namespaces."""
    settings = {"argv": argv, "env": env, "rlimits": rlimits, "tmp_bytes": tmp_bytes, "status_fd": status_fd}
    return [*UNSHARE, python, "-I", "-S", "-B", "-c", INIT, json.dumps(settings)]


def parse_status(text: str) -> tuple[int | None, str | None]:
    """(return code, setup error) from INIT's status lines: "exit N" -> N, "signal S" -> -S."""
    lines = text.strip().splitlines()
    setup = [line for line in lines if line.startswith("setup ")]
    kind, _, value = (setup or lines or [""])[-1].partition(" ")
    if kind == "exit":
        return int(value), None
    if kind == "signal":
        return -int(value), None
    if kind == "setup":
        return None, value
    return None, None


def probe_namespaces(python: str = sys.executable) -> str | None:
    """None when `namespaces` mode works here, else why not (one line)."""
    import os

    read, write = os.pipe()
    try:
        command = namespace_command(python, [python, "-I", "-S", "-c", "pass"], {"PATH": "/usr/bin:/bin"},
                                    {}, 1 << 20, write)
        try:
            proc = subprocess.run(command, pass_fds=(write,), stdin=subprocess.DEVNULL, capture_output=True,
                                  timeout=30)
        except FileNotFoundError:
            return "`unshare` (util-linux) is not installed"
        except subprocess.TimeoutExpired:
            return "a namespace probe did not finish within 30 s"
        os.close(write)
        write = -1
        with os.fdopen(read, "r") as status:
            read = -1
            code, setup_error = parse_status(status.read())
    finally:
        for fd in (read, write):
            if fd >= 0:
                os.close(fd)
    if setup_error:
        return f"setting up the namespaces failed: {setup_error}"
    if code != 0:
        detail = proc.stderr.decode(errors="replace").strip().splitlines()
        return (f"`unshare --user --pid --mount --net` failed ({detail[-1] if detail else f'exit {proc.returncode}'}); "
                "user namespaces are off or forbidden (e.g. Docker's default seccomp profile)")
    return None


class PidsCgroup:
    """A pids cgroup per run, for servers running as root (see the module docstring).

    `PidsCgroup.find()` is None unless we are root and a pids hierarchy is writable. `create(limit)`
    makes a fresh child group; `join` (a preexec function) moves the starting process into it, so
    the run and all its descendants count against `pids.max`; `remove` deletes it once empty.
    """

    _counter = itertools.count()

    def __init__(self, root: Path):
        self.root = root

    @classmethod
    def find(cls) -> PidsCgroup | None:
        if os.geteuid() != 0:
            return None
        candidates = [Path("/sys/fs/cgroup/pids")]
        own = next((line.split(":", 2)[2].strip() for line in _read("/proc/self/cgroup").splitlines()
                    if line.startswith("0::")), None)
        if own is not None and "pids" in _read(f"/sys/fs/cgroup{own}/cgroup.subtree_control").split():
            candidates.append(Path(f"/sys/fs/cgroup{own}"))
        for root in candidates:
            probe = root / f"rl_factory_probe_{os.getpid()}"
            try:
                probe.mkdir()
                probe.rmdir()
                return cls(root)
            except OSError:
                continue
        return None

    def create(self, limit: int) -> Path:
        group = self.root / f"rl_factory_sandbox_{os.getpid()}_{next(self._counter)}"
        group.mkdir()
        (group / "pids.max").write_text(str(limit))
        return group

    @staticmethod
    def join(group: Path):
        def preexec() -> None:
            (group / "cgroup.procs").write_text(str(os.getpid()))
        return preexec

    @staticmethod
    def remove(group: Path) -> None:
        # The namespace's processes are reaped a moment after its init exits (longer for a fork bomb
        # on a loaded machine): keep trying for a while, then leave the empty group behind.
        for attempt in range(200):
            try:
                group.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                time.sleep(min(0.01 * (attempt + 1), 0.1))


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""
