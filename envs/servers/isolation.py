"""How the Python sandbox isolates one run: `namespaces` (the default) or, by name only, `process`.

`namespaces` holds against code written to escape. Each run is started as

    unshare [--user --map-root-user] --pid --fork --mount --net --ipc --uts --kill-child -- python INIT

(`--user` only when the server is not root: root needs no user namespace to set the run up, and
the code must not run as root), so it gets fresh pid, mount, network, IPC, UTS and cgroup namespaces.
INIT runs as pid 1 of the new pid namespace and builds the run's whole view of the files:

  1. a new root (a small tmpfs) holding only: the interpreter's prefix, the venv and /usr (bound
     read-only, `nodev,nosuid`), the paths the manifest lists with `--ro-path` (the same), a private
     size-capped /tmp (the working directory; bound before any read-only path under it, so an
     interpreter under /tmp works), a /dev with only null, zero, random, urandom and a private
     /dev/shm, the namespace's own /proc, and an /etc with a passwd and group file naming the run's
     user; then pivot_root into it and detach the host's tree. Nothing else of the host exists in
     the view: no /run or /var/run (no Unix socket of the host), /home, /root, /etc/shadow, /sys
     (no GPU), the project, the dataset or the reward file;
  2. forks the code's process, which sets RLIMIT_CPU / AS / NPROC / FSIZE / NOFILE / CORE, drops
     every capability (bounding set; then, when the server is root, switches to uid and gid 65534,
     `nobody`, which clears the rest; otherwise capset to none), sets no_new_privs and execs the
     interpreter on the code;
  3. waits for it and writes its exit status to a pipe the server reads, then exits.

When pid 1 exits, or is killed at the deadline (SIGKILL to `unshare`'s process group; `--kill-child`
takes pid 1 with it), the kernel kills every process of the namespace, and the run's tmpfs
mounts, SysV IPC objects and network namespace go with it. The new network namespace has no
interface but a downed loopback: no IP socket reaches anything, and the abstract Unix socket
namespace is the network namespace's own. Needs `unshare` (util-linux); a server that is not root
also needs user namespaces (`kernel.unprivileged_userns_clone=1`; Docker's default seccomp
profile forbids them).

`process` is the weaker mode, for machines without namespaces, and is used only when the manifest
names it (`--isolation process`): a fresh process in a new session with the same rlimits, an empty
temporary directory, no inherited environment, and a socket stub; `MISSING_IN_PROCESS_MODE` lists
what it lacks, and the tool description says so.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess

MODES = ("namespaces", "process")
ENGINES = ("auto", "bwrap", "unshare")  # namespaces mode: bwrap where installed (auto), else this module's
NOBODY = 65534
NAMESPACES = ["--pid", "--fork", "--mount", "--net", "--ipc", "--uts", "--cgroup", "--propagation", "private",
              "--kill-child"]
DEVICES = ("null", "zero", "random", "urandom")
MISSING_IN_PROCESS_MODE = (
    "no pid namespace: the code can see the host's processes, signal those of the server's user and "
    "read their /proc (environment variables, API keys)",
    "no mount namespace: it can read and write whatever the server's user can (the reward file, the "
    "dataset, credentials, the project) and reach the host's Unix sockets and devices",
    "no network namespace: only a socket stub, which code can undo, keeps it off the network",
    "no namespace to tear down: a process that leaves the run's session outlives the call",
)
# Where the interpreter's files live: every prefix it reads at start-up and import time.
PATHS_PROBE = ("import json, os, site, sys, sysconfig\n"
               "paths = [sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,\n"
               "         os.path.dirname(os.path.realpath(sys.executable)), *site.getsitepackages(),\n"
               "         sysconfig.get_paths()['stdlib'], sysconfig.get_paths()['platstdlib']]\n"
               "print(json.dumps(sorted({os.path.realpath(p) for p in paths} | set(paths))))")

# pid 1 of the run's namespaces (argv[1]: JSON settings). Runs with -I -S: the standard library only.
INIT = r"""
import ctypes, json, os, resource, sys
cfg = json.loads(sys.argv[1])
status = os.fdopen(cfg["status_fd"], "w")
os.set_inheritable(cfg["status_fd"], False)  # closed by the code's exec, open for an exec failure's report
libc = ctypes.CDLL(None, use_errno=True)
RDONLY, NOSUID, NODEV, NOEXEC, REMOUNT, BIND, REC = 1, 2, 4, 8, 32, 4096, 16384
PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "riscv64": 41, "ppc64le": 203, "s390x": 217}[os.uname().machine]
def report(line):
    status.write(line + "\n")
    status.flush()
def fail(what):
    err = ctypes.get_errno()
    raise OSError(err, os.strerror(err), what)
def mount(source, target, fstype, flags, data=None):
    enc = lambda s: None if s is None else s.encode()
    if libc.mount(enc(source), enc(target), enc(fstype), flags, enc(data)) != 0:
        fail(target)
def bind_ro(fd, target, extra=NODEV):
    try:
        mount("/proc/self/fd/%d" % fd, target, None, BIND)
    except OSError:  # in a user namespace, a mount with mounts below it binds only recursively
        mount("/proc/self/fd/%d" % fd, target, None, BIND | REC)
    kept = os.statvfs(target).f_flag  # flags a user namespace may not clear: keep them
    kept = (kept & (NOEXEC | 1024 | 2048)) | ((1 << 21) if kept & 4096 else 0)
    mount(None, target, None, BIND | REMOUNT | RDONLY | NOSUID | extra | kept)
def place(root, path, is_dir):
    os.makedirs(root + (path if is_dir else os.path.dirname(path)), 0o755, exist_ok=True)
    if not is_dir and not os.path.lexists(root + path):
        open(root + path, "w").close()
try:
    # Open every source first: the staging root below covers the host's /tmp (which may hold them).
    sources = [(p, None if link else os.open(p, os.O_PATH | os.O_CLOEXEC), link, is_dir)
               for p, link, is_dir in cfg["view"]]
    devices = [(d, os.open("/dev/" + d, os.O_PATH | os.O_CLOEXEC)) for d in cfg["devices"]]
    root = "/tmp"
    mount("tmpfs", root, "tmpfs", NOSUID | NODEV, "size=4m,mode=755")
    place(root, "/tmp", True)
    mount("tmpfs", root + "/tmp", "tmpfs", NOSUID | NODEV, "size=%d,mode=1777" % cfg["tmp_bytes"])
    place(root, "/dev", True)
    mount("tmpfs", root + "/dev", "tmpfs", NOSUID | NODEV | NOEXEC, "size=64k,mode=755")
    os.makedirs(root + "/dev/shm")
    mount("tmpfs", root + "/dev/shm", "tmpfs", NOSUID | NODEV, "size=%d,mode=1777" % cfg["shm_bytes"])
    for name, fd in devices:
        place(root, "/dev/" + name, False)
        bind_ro(fd, root + "/dev/" + name, extra=NOEXEC)  # a device node: its mount alone allows devices
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"),
                         ("stdout", "/proc/self/fd/1"), ("stderr", "/proc/self/fd/2")):
        os.symlink(target, root + "/dev/" + name)
    mount(None, root + "/dev", None, REMOUNT | RDONLY | NOSUID | NODEV | NOEXEC)
    place(root, "/proc", True)
    mount("proc", root + "/proc", "proc", NOSUID | NODEV | NOEXEC)
    for path, fd, link, is_dir in sources:  # parents first (view_plan's order)
        if link is not None:  # e.g. /lib -> usr/lib: the link, and its target listed on its own
            place(root, os.path.dirname(path), True)
            os.symlink(link, root + path)
        else:
            place(root, path, is_dir)
            bind_ro(fd, root + path)
    for fd in [s[1] for s in sources if s[1] is not None] + [d[1] for d in devices]:
        os.close(fd)
    bound = [s[0] for s in sources]
    for name, text in cfg["etc"].items():
        if not any(("/etc/" + name).startswith(b.rstrip("/") + "/") for b in bound):
            place(root, "/etc", True)
            with open(root + "/etc/" + name, "w") as f:
                f.write(text)
    libc.sethostname(b"sandbox", 7)
    os.chdir(root)
    if libc.syscall(PIVOT_ROOT, b".", b".") != 0:  # the old root is stacked under the new one ...
        fail("pivot_root")
    if libc.umount2(b".", 2) != 0:  # ... and detached (MNT_DETACH): nothing of the host is left
        fail("umount2")
    os.chdir("/")
    mount(None, "/", None, REMOUNT | RDONLY | NOSUID | NODEV)
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
        if cfg["uid"] is not None:  # root: become nobody, which clears every capability
            os.setgroups([])
            os.setresgid(cfg["uid"], cfg["uid"], cfg["uid"])
            os.setresuid(cfg["uid"], cfg["uid"], cfg["uid"])
        if libc.prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS
            fail("prctl(PR_SET_NO_NEW_PRIVS)")
        header, data = (ctypes.c_uint32 * 2)(0x20080522, 0), (ctypes.c_uint32 * 6)()
        if libc.capset(header, data) != 0:
            fail("capset")
        os.execve(cfg["argv"][0], cfg["argv"], cfg["env"])
    except BaseException as err:
        report("setup %s: %s" % (type(err).__name__, err))
        os._exit(127)
status_of = lambda st: "signal %d" % os.WTERMSIG(st) if os.WIFSIGNALED(st) else "exit %d" % os.WEXITSTATUS(st)
_, st = os.waitpid(child, 0)
report(status_of(st))
"""


def interpreter_paths(python: str) -> list[str]:
    """The directories `python` reads its standard library and packages from (asked of it, once)."""
    try:
        proc = subprocess.run([python, "-I", "-c", PATHS_PROBE], capture_output=True, text=True, timeout=60)
    except OSError as err:
        raise RuntimeError(f"cannot run the interpreter {python}: {err}") from None
    if proc.returncode != 0:
        detail = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
        raise RuntimeError(f"the interpreter {python} failed to start: {detail}")
    return json.loads(proc.stdout)


def pick_engine(requested: str = "auto") -> str:
    """`bwrap` (envs/servers/bwrap.py) when asked or, for `auto`, when installed; else `unshare` (INIT)."""
    if requested == "auto":
        return "bwrap" if shutil.which("bwrap") else "unshare"
    return requested


def view_plan(paths: list[str]) -> list[tuple[str, str | None, bool]]:
    """(path, symlink target or None, is a directory) for each path the run sees, parents first;
    a path inside another one is already visible through it, and a missing one is left out."""
    plan: list[tuple[str, str | None, bool]] = []
    for path in sorted(set(paths)):
        if not os.path.lexists(path) or any(path.startswith(p.rstrip("/") + "/") for p, _, _ in plan):
            continue
        plan.append((path, os.readlink(path) if os.path.islink(path) else None, os.path.isdir(path)))
    return plan


def system_paths() -> list[str]:
    """/usr (the interpreter's shared libraries) and the top-level links or directories into it."""
    return ["/usr", *(p for p in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32") if os.path.lexists(p))]


def run_user() -> int | None:
    """The uid (and gid) the code switches to: `nobody` when the server is root (and `nobody` exists in
    its user namespace), else None: the code keeps the server's own, unprivileged, uid."""
    return NOBODY if os.geteuid() == 0 and _mapped(NOBODY) else None


def _mapped(uid: int) -> bool:
    try:
        ranges = [tuple(map(int, line.split())) for line in open("/proc/self/uid_map")]
    except OSError:
        return False
    return any(inside <= uid < inside + count for inside, _, count in ranges)


def etc_files(uid: int, gid: int) -> dict[str, str]:
    """The run's /etc/passwd and /etc/group: `sandbox` is the code's uid and gid as seen inside."""
    root = uid != 0 and gid != 0
    return {"passwd": ("root:x:0:0:root:/root:/usr/sbin/nologin\n" if root else "")
            + f"sandbox:x:{uid}:{gid}:sandbox:/tmp:/usr/sbin/nologin\n",
            "group": ("root:x:0:\n" if root else "") + f"sandbox:x:{gid}:\n"}


def unshare_prefix() -> list[str]:
    user = ["--user", "--map-root-user"] if run_user() is None else []
    return ["unshare", *user, *NAMESPACES, "--"]


def namespace_command(python: str, argv: list[str], env: dict[str, str], rlimits: dict, tmp_bytes: int,
                      status_fd: int, ro_paths: list[str], shm_bytes: int = 16 << 20) -> list[str]:
    """The command that runs `argv` (an interpreter and its arguments) in fresh namespaces, seeing
    only `ro_paths` (read-only) of the host's files."""
    settings = {"argv": argv, "env": env, "rlimits": rlimits, "tmp_bytes": tmp_bytes, "shm_bytes": shm_bytes,
                "status_fd": status_fd, "view": view_plan(ro_paths), "devices": DEVICES,
                # without root the code is uid 0 of its user namespace (--map-root-user)
                "etc": etc_files(NOBODY, NOBODY) if run_user() is not None else etc_files(0, 0), "uid": run_user()}
    return [*unshare_prefix(), python, "-I", "-S", "-B", "-c", INIT, json.dumps(settings)]


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


def with_targets(paths: list[str]) -> list[str]:
    """Each path, and where its symlinks lead (the view recreates a link; its target must be there too)."""
    return list(dict.fromkeys(q for p in paths for q in (os.path.abspath(p), os.path.realpath(p))))


def refusal(reason: str) -> str:
    """Why the server will not start in namespaces mode, and what running in process mode would lack."""
    missing = "".join(f"\n  - {m}" for m in MISSING_IN_PROCESS_MODE)
    return (f"python_sandbox: --isolation namespaces is not available here: {reason}.\n"
            f"Without it the code would run with these protections missing:{missing}\n"
            "To accept that, name the weaker mode in the manifest's args: --isolation process")
