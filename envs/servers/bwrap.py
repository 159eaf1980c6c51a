"""The namespaces mode's engine where bubblewrap is installed: the same view of the host, built by `bwrap`.

bwrap (Debian's `bubblewrap`) builds the run's namespaces and files in C, about as fast as starting
the interpreter alone, where the fallback engine (envs/servers/isolation.py) starts a second Python
to do it (benchmarks/sandbox.py). The view is the same one: the paths `isolation.view_plan` lists
(the interpreter, /usr, `--ro-path`s) bound read-only under a fresh root, a private size-capped /tmp
bound first (so an interpreter under /tmp works), a /dev with only null, zero, random, urandom and
a private /dev/shm, its own /proc, /etc/passwd and /etc/group naming the run's user, fresh pid,
network, IPC, UTS (and cgroup) namespaces, `--die-with-parent` and `--new-session`.

Run by root, bwrap needs no user namespace, and keeps only CAP_SETUID, CAP_SETGID and CAP_SETPCAP
for RUNNER (envs/servers/runner.py), whose first act is to empty the bounding set and become
`nobody`, which clears them; run by another user it makes a user namespace and the code keeps that
user's uid. RUNNER's parent half reports the
code's exit status on the status pipe, so the server reads the same "exit N" / "signal S" lines as
from the fallback; a bwrap that fails to set up never starts RUNNER, and its own message (on the
run's stderr) is the setup error.
"""
from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from functools import cache

from envs.servers.isolation import DEVICES, NOBODY, etc_files, run_user, view_plan


def _etc() -> dict[str, str]:
    # --unshare-user (a non-root server) keeps the server's uid and gid inside
    return etc_files(NOBODY, NOBODY) if run_user() is not None else etc_files(os.geteuid(), os.getegid())


@cache
def _etc_dir() -> str:
    # The run's /etc/passwd and /etc/group, written once per server and bound read-only into each run.
    path = tempfile.mkdtemp(prefix="rlf-sandbox-etc-")
    os.chmod(path, 0o755)
    for name, text in _etc().items():
        with open(os.path.join(path, name), "w") as f:
            f.write(text)
        os.chmod(os.path.join(path, name), 0o644)
    atexit.register(shutil.rmtree, path, True)
    return path


def bwrap_command(argv: list[str], env: dict[str, str], view: list[str], tmp_bytes: int,
                  shm_bytes: int) -> list[str]:
    """The command that runs `argv` (the interpreter on RUNNER) under bwrap, seeing only `view` of the host."""
    user = [] if run_user() is not None else ["--unshare-user"]
    caps = ["--cap-drop", "ALL", *(arg for cap in ("CAP_SETUID", "CAP_SETGID", "CAP_SETPCAP")
                                    for arg in ("--cap-add", cap))] if run_user() is not None \
        else ["--cap-drop", "ALL"]
    args = ["bwrap", *user, "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts",
            "--unshare-cgroup-try", "--hostname", "sandbox", "--die-with-parent", "--new-session", *caps,
            "--perms", "1777", "--size", str(tmp_bytes), "--tmpfs", "/tmp",
            "--tmpfs", "/dev"]
    for name in DEVICES:
        args += ["--dev-bind", f"/dev/{name}", f"/dev/{name}"]
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"),
                         ("stdout", "/proc/self/fd/1"), ("stderr", "/proc/self/fd/2")):
        args += ["--symlink", target, f"/dev/{name}"]
    args += ["--perms", "1777", "--size", str(shm_bytes), "--tmpfs", "/dev/shm", "--remount-ro", "/dev",
             "--proc", "/proc"]
    bound, made = [], {"/", "/tmp", "/dev", "/proc"}

    def parents(path: str) -> list[str]:  # bwrap would make them 0700 (root): the run's user must pass
        missing = [p for p in _ancestors(path) if p not in made]
        made.update(missing)
        return [arg for p in missing for arg in ("--perms", "0755", "--dir", p)]

    for path, link, _ in view_plan(view):
        args += [*parents(path), *(["--symlink", link, path] if link is not None else ["--ro-bind", path, path])]
        bound.append(path)
    for name in _etc():
        if not any(f"/etc/{name}".startswith(b.rstrip("/") + "/") for b in bound):
            args += [*parents(f"/etc/{name}"), "--ro-bind", os.path.join(_etc_dir(), name), f"/etc/{name}"]
    args += ["--remount-ro", "/", "--chdir", "/tmp", "--clearenv"]
    for key, value in env.items():
        args += ["--setenv", key, value]
    return [*args, "--", *argv]


def _ancestors(path: str) -> list[str]:
    parts = path.strip("/").split("/")[:-1]
    return ["/" + "/".join(parts[:i]) for i in range(1, len(parts) + 1)]
