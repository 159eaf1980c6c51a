"""Whether the Python sandbox's `namespaces` isolation runs here, with which engine: `probe_namespaces`, one
tiny run through the same command a sandboxed run gets (envs/servers/isolation.py for `unshare`,
envs/servers/bwrap.py for bubblewrap). The server refuses to start without it unless the manifest names the
weaker `process` mode; the tests and benchmarks/sandbox.py ask it which engines this machine has."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from envs.servers.bwrap import bwrap_command
from envs.servers.isolation import (interpreter_paths, namespace_command, parse_status, pick_engine, run_user,
                                    system_paths, unshare_prefix)
from envs.servers.runner import RUNNER


def probe_namespaces(python: str = sys.executable, ro_paths: list[str] | None = None,
                     engine: str = "auto") -> str | None:
    """None when `namespaces` mode runs `python` here with `engine`, else why not (one line naming the
    real cause)."""
    engine = pick_engine(engine)
    try:
        paths = [*system_paths(), *interpreter_paths(python), *(ro_paths or [])]
    except RuntimeError as err:
        return str(err)
    read, write = os.pipe()
    try:
        if engine == "bwrap":
            settings = {"rlimits": {}, "socket_stub": False, "status_fd": write, "uid": run_user()}
            command = bwrap_command([python, "-I", "-B", "-c", RUNNER, json.dumps(settings)], {}, paths, 1 << 20,
                                    1 << 20)
        else:
            command = namespace_command(python, [python, "-I", "-S", "-c", "pass"], {"PATH": "/usr/bin:/bin"},
                                        {}, 1 << 20, write, paths)
        try:
            proc = subprocess.run(command, pass_fds=(write,), input=b"pass", capture_output=True, timeout=30)
        except FileNotFoundError:
            return f"`{command[0]}` is not installed"
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
        detail = detail[-1] if detail else f"exit {proc.returncode}"
        forbidden = code is None and any(s in detail for s in ("unshare failed", "No permissions to create",
                                                                 "Creating new namespace failed", "setting up uid map"))
        cause = ("; creating namespaces is forbidden here (e.g. Docker's default seccomp profile, or "
                 "kernel.unprivileged_userns_clone=0)") if forbidden else ""
        name = "bwrap" if engine == "bwrap" else " ".join(unshare_prefix()[:-1])
        return f"`{name}` failed ({detail}){cause}"
    return None
