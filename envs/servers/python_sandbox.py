"""Python sandbox MCP server: `run_python(code)` runs a program in a fresh, isolated, limited process.

Each call starts a new interpreter (this server's own, so the venv's packages import), isolated as
`--isolation` says (envs/servers/isolation.py):
  * `namespaces` (default): fresh pid, mount, network, IPC, UTS and cgroup namespaces, built by
    bubblewrap where it is installed (envs/servers/bwrap.py), else by the fallback engine
    (envs/servers/isolation.py; `--engine` picks one); the code sees only the
    interpreter, /usr and the paths the manifest lists (`--ro-path`), read-only, plus a private
    size-capped /tmp (the working directory), a minimal /dev and its own /proc; no network, no host
    socket, no other process visible, no capabilities, not root (`nobody` when the server is root),
    and every process of the run killed when it ends or hits its deadline;
  * `process`: only where namespaces cannot be had, and only when the manifest names it: a fresh
    process with the same limits but none of the isolation (the tool description lists what is
    missing). Asked for `namespaces` where they do not work, the server refuses to start and says
    which protections would be missing.
In both modes the code gets no inherited environment and these limits:
  * CPU time (RLIMIT_CPU: SIGXCPU at the limit, SIGKILL a second later), address space
    (RLIMIT_AS: a huge allocation raises MemoryError), processes (a pids cgroup, else RLIMIT_NPROC:
    a fork bomb gets EAGAIN), file size (RLIMIT_FSIZE: a bigger write fails with EFBIG), open files
    (RLIMIT_NOFILE);
  * all the memory the run holds (its processes, memfds, shared memory, /tmp) under a per-run memory
    cgroup (envs/servers/cgroups.py) where the host has one: past it the run is killed. Where it has
    none, the server says so at start and in the tool description: then only RLIMIT_AS holds;
  * a wall-clock timeout, after which everything the run started is killed;
  * stdout and stderr captured separately, each cut to its first and last bytes around a
    `[... N bytes truncated ...]` marker; a run printing more than 16 MiB is killed.

The code's own outcome (an exception, a limit hit, a non-zero exit) is a normal result, not a
tool error: the tool did its job and the model reads what happened. The result text is the
program's stdout, then `[stderr]` and its stderr, then one status line such as `[exit code 0]`
or `[killed: CPU time limit of 5 s exceeded]`; structured content carries the same fields.

Flags (or env vars, which the manifest must pass through `env`): --cpu-seconds
(RL_FACTORY_SANDBOX_CPU_S, 5), --memory-mb (RL_FACTORY_SANDBOX_MEMORY_MB, 1024), --timeout-s
(RL_FACTORY_SANDBOX_TIMEOUT_S, 10), --max-output-bytes (RL_FACTORY_SANDBOX_MAX_OUTPUT_BYTES, 4096
per stream), --max-parallel (RL_FACTORY_SANDBOX_MAX_PARALLEL, 4 runs at once; more calls wait),
--max-processes (64), --max-file-mb (16), --tmp-mb (64, namespaces mode), --isolation
namespaces|process (RL_FACTORY_SANDBOX_ISOLATION, namespaces), --ro-path PATH (repeatable; or
RL_FACTORY_SANDBOX_RO_PATHS, paths joined by ":"): more host paths the code may read (namespaces),
--engine auto|bwrap|unshare (RL_FACTORY_SANDBOX_ENGINE, auto: bwrap where installed); docs/security.md.
"""
import argparse
import asyncio
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Annotated

from pydantic import BaseModel

from envs.servers.capture import MAX_DRAIN_BYTES, Capture, drain
from envs.servers.cgroups import RunCgroups
from envs.servers.bwrap import bwrap_command
from envs.servers.isolation import (ENGINES, MISSING_IN_PROCESS_MODE, MODES, interpreter_paths, namespace_command,
                                    parse_status, pick_engine, refusal, run_user, system_paths, with_targets)
from envs.servers.probe import probe_namespaces
from envs.servers.runner import RUNNER
from envs.servers.stdio import serve

MAX_CODE_CHARS = 200_000
DRAIN_AFTER_EXIT_S = 2.0  # process mode: an escaped grandchild may hold the pipes open: stop reading then


class SandboxError(RuntimeError):
    """The sandbox could not be set up for a run (not the code's failure)."""


@dataclass
class SandboxConfig:
    cpu_seconds: int = 5
    memory_mb: int = 1024
    timeout_s: float = 10.0
    max_output_bytes: int = 4096
    max_parallel: int = 4
    max_processes: int = 64
    max_file_mb: int = 16
    tmp_mb: int = 64
    isolation: str = "namespaces"  # or "process" (see envs/servers/isolation.py)
    engine: str = "auto"  # namespaces mode: bwrap | unshare | auto (bwrap where installed)
    python: str = sys.executable
    ro_paths: list[str] = field(default_factory=list)  # more host paths the code may read (namespaces)
    # Per-run pids and memory cgroups where the host has them (found by main(); see envs/servers/cgroups.py).
    cgroup: RunCgroups | None = None
    _view: list[str] | None = None

    @property
    def processes_capped(self) -> bool:
        # The kernel exempts uid 0 from RLIMIT_NPROC; namespaces mode runs a root server's code as nobody.
        as_nobody = self.isolation == "namespaces" and run_user() is not None
        return os.geteuid() != 0 or self.has_cgroup("pids") or as_nobody

    @property
    def memory_capped(self) -> bool:
        return self.has_cgroup("memory")

    def has_cgroup(self, controller: str) -> bool:
        return self.cgroup is not None and self.cgroup.has(controller)

    def view(self) -> list[str]:
        """The host paths a run sees (read-only): /usr, the interpreter's prefixes, `ro_paths`."""
        if self._view is None:
            self._view = [*system_paths(), *interpreter_paths(self.python), *self.ro_paths]
        return self._view

    def rlimits(self) -> dict[str, tuple[int, int]]:
        # With a pids cgroup, that is the cap: RLIMIT_NPROC counts every process of the uid (all runs'
        # `nobody`), so one run's fork bomb would starve the others.
        nproc = resource.getrlimit(resource.RLIMIT_NPROC)[1] if self.has_cgroup("pids") else self.max_processes
        return {"RLIMIT_CPU": (self.cpu_seconds, self.cpu_seconds + 1),
                "RLIMIT_AS": (self.memory_mb << 20, self.memory_mb << 20),
                "RLIMIT_NPROC": (nproc, nproc),
                "RLIMIT_FSIZE": (self.max_file_mb << 20, self.max_file_mb << 20),
                "RLIMIT_NOFILE": (256, 256), "RLIMIT_CORE": (0, 0)}

    def __post_init__(self) -> None:
        self.engine = pick_engine(self.engine)

    def command(self, env: dict[str, str], status_fd: int) -> list[str]:
        """The command for one run; `status_fd` is where namespaces mode reports the exit status."""
        shm = min(self.tmp_mb, 16) << 20
        if self.isolation == "namespaces" and self.engine == "bwrap":  # RUNNER sets the limits and reports
            settings = {"rlimits": self.rlimits(), "socket_stub": False, "status_fd": status_fd, "uid": run_user()}
            runner = [self.python, "-I", "-B", "-u", "-c", RUNNER, json.dumps(settings)]
            return bwrap_command(runner, env, self.view(), self.tmp_mb << 20, shm)
        if self.isolation == "namespaces":  # limits are set by the namespace's init, before exec
            runner = [self.python, "-I", "-B", "-u", "-c", RUNNER, json.dumps({"rlimits": {}, "socket_stub": False})]
            return namespace_command(self.python, runner, env, self.rlimits(), self.tmp_mb << 20, status_fd,
                                     self.view(), shm_bytes=shm)
        settings = {"rlimits": self.rlimits(), "socket_stub": True}
        return [self.python, "-I", "-B", "-u", "-c", RUNNER, json.dumps(settings)]

    def describe(self) -> str:
        memory = (f"{self.memory_mb} MB memory (all the run holds)" if self.memory_capped else
                  f"{self.memory_mb} MB address space per process (memory held in memfds, shared memory or "
                  "files is not capped: no memory cgroup here)")
        uncapped = " (not enforced: the code runs as root without a pids cgroup)"
        limits = (f"Limits per call: {self.cpu_seconds} s CPU time, {memory}, "
                  f"{self.timeout_s:g} s wall clock, {self.max_output_bytes} bytes of output per "
                  f"stream, {self.max_processes} processes{'' if self.processes_capped else uncapped}, "
                  f"{self.max_file_mb} MB per file. ")
        if self.isolation == "namespaces":
            return limits + (f"Isolation: namespaces ({self.engine}; no network, no files of the host but "
                             f"the interpreter's, read-only, a private {self.tmp_mb} MB /tmp as the working "
                             "directory, no other process visible, no GPU). Each call starts fresh; nothing persists between calls.")
        return limits + ("Isolation: process only (weaker; missing: " + "; ".join(MISSING_IN_PROCESS_MODE)
                         + "). Network sockets are stubbed out. Each call starts in a new empty directory.")


class RunResult(BaseModel):
    status: str  # ok | error | cpu_limit | memory_limit | timeout | output_limit | signal
    exit_code: int  # the process's return code; negative: killed by that signal
    stdout: str
    stderr: str
    stdout_truncated: bool
    stderr_truncated: bool
    duration_s: float


def _child_env(workdir: str) -> dict[str, str]:
    # Nothing of the server's environment (API keys, ...) reaches the code.
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": workdir, "TMPDIR": workdir,
            "PYTHONDONTWRITEBYTECODE": "1",
            "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "OMP_NUM_THREADS": "1",
            "OPENBLAS_NUM_THREADS": "1", "MPLBACKEND": "Agg",
            # No GPU device is in the sandbox's /dev; these keep CUDA libraries from looking for one.
            "CUDA_VISIBLE_DEVICES": "", "NVIDIA_VISIBLE_DEVICES": "void", "HIP_VISIBLE_DEVICES": ""}


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # already gone


async def run_code(code: str, cfg: SandboxConfig) -> RunResult:
    """Run `code` in a fresh isolated, limited process and report what it printed and how it ended.

    Raises:
        SandboxError: the isolation could not be set up for this run.
    """
    strong = cfg.isolation == "namespaces"
    workdir = None if strong else tempfile.mkdtemp(prefix="rlf-sandbox-")
    status_read, status_write = os.pipe() if strong else (-1, -1)
    env = _child_env("/tmp" if strong else workdir)  # /tmp: the run's own tmpfs
    start, proc, group = time.monotonic(), None, None
    try:
        if cfg.cgroup is not None and cfg.cgroup.roots:
            group = cfg.cgroup.create(cfg.max_processes, cfg.memory_mb << 20)
        proc = await asyncio.create_subprocess_exec(
            *cfg.command(env, status_write), cwd=workdir or "/", env=env, start_new_session=True,
            pass_fds=(status_write,) if strong else (), preexec_fn=RunCgroups.join(group) if group else None,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        if strong:
            os.close(status_write)
            status_write = -1
        killed_for: list[str] = []

        def flood() -> None:
            killed_for.append("output_limit")
            _kill_group(proc.pid)

        out, err = Capture(cfg.max_output_bytes), Capture(cfg.max_output_bytes)
        readers = [asyncio.create_task(drain(proc.stdout, out, flood)),
                   asyncio.create_task(drain(proc.stderr, err, flood))]
        try:
            proc.stdin.write(code.encode("utf-8", "replace"))
            await proc.stdin.drain()
            proc.stdin.close()
        except (BrokenPipeError, ConnectionResetError):
            pass  # the child died before reading: its exit status tells why
        if not await _exited(proc, cfg.timeout_s):
            killed_for.append("timeout")
        _kill_group(proc.pid)  # the timed-out run (namespaces: its whole pid namespace), or leftovers
        await _exited(proc, None)
        _, pending = await asyncio.wait(readers, timeout=DRAIN_AFTER_EXIT_S)
        for task in pending:
            task.cancel()
        returncode = proc.returncode
        if strong:
            code_status, setup_error = parse_status(_read_all(status_read))
            if setup_error is None and code_status is None and not killed_for and cfg.engine == "bwrap" \
                    and not (group is not None and RunCgroups.oom_killed(group)):
                setup_error = (err.text().strip().splitlines() or [f"bwrap exited {returncode}"])[-1]
            if setup_error:
                raise SandboxError(f"could not set up the sandbox: {setup_error}")
            if code_status is not None and not killed_for:
                returncode = code_status
        if group is not None and RunCgroups.oom_killed(group):
            killed_for.append("memory_limit")
    finally:
        if proc is not None and proc.returncode is None:
            _kill_group(proc.pid)  # we were cancelled (e.g. the client gave up): no orphan run
        for fd in (status_read, status_write):
            if fd >= 0:
                os.close(fd)
        if workdir is not None:
            _remove(workdir)
        if group is not None:
            await asyncio.shield(asyncio.to_thread(RunCgroups.remove, group))
    return RunResult(status=_status(returncode, killed_for), exit_code=returncode,
                     stdout=out.text(), stderr=err.text(), stdout_truncated=out.truncated,
                     stderr_truncated=err.truncated, duration_s=round(time.monotonic() - start, 3))


async def _exited(proc: asyncio.subprocess.Process, timeout_s: float | None) -> bool:
    """Whether the process exited within `timeout_s`. Polled, not `proc.wait()`, which (Python 3.11+)
    also waits for its pipes to close, and an escaped child of the code may hold them open."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while proc.returncode is None:
        if deadline is not None and time.monotonic() >= deadline:
            return False
        await asyncio.sleep(0.01)
    return True


def _read_all(fd: int) -> str:
    # Every writer (the namespace's init) has exited by now: this reads to EOF without waiting.
    os.set_blocking(fd, False)
    chunks = []
    try:
        while chunk := os.read(fd, 4096):
            chunks.append(chunk)
    except BlockingIOError:
        pass
    return b"".join(chunks).decode(errors="replace")


def _status(returncode: int, killed_for: list[str]) -> str:
    if killed_for:
        return killed_for[0]
    if returncode == -signal.SIGXCPU:
        return "cpu_limit"
    return "ok" if returncode == 0 else "error" if returncode > 0 else "signal"


def _remove(workdir: str) -> None:
    shutil.rmtree(workdir, ignore_errors=True)
    if os.path.exists(workdir):  # the code chmod-ed something away: give ourselves access back
        for root, dirs, _ in os.walk(workdir):
            for name in dirs:
                os.chmod(os.path.join(root, name), 0o700)
        shutil.rmtree(workdir, ignore_errors=True)


def format_result(result: RunResult, cfg: SandboxConfig) -> str:
    """What the model reads: stdout, then `[stderr]` + stderr, then one status line."""
    parts = [result.stdout.rstrip("\n")] if result.stdout else []
    if result.stderr:
        parts.append("[stderr]\n" + result.stderr.rstrip("\n"))
    if not parts:
        parts.append("[no output]")
    code = result.exit_code
    status = {
        "ok": f"[exit code {code}]",
        "error": f"[exit code {code}]",
        "cpu_limit": f"[killed: CPU time limit of {cfg.cpu_seconds} s exceeded]",
        "memory_limit": f"[killed: memory limit of {cfg.memory_mb} MB exceeded]",
        "timeout": f"[killed: wall-clock timeout of {cfg.timeout_s:g} s]",
        "output_limit": f"[killed: more than {MAX_DRAIN_BYTES >> 20} MiB of output]",
    }.get(result.status) or f"[killed by signal {_signal_name(-code)}]"
    return "\n".join([*parts, status])


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return str(number)


def build_server(cfg: SandboxConfig):
    """The MCP server object (`cfg.isolation` is used as given: `main` checks it works here)."""
    from mcp.server.mcpserver import MCPServer
    from mcp.server.mcpserver.exceptions import ToolError
    from mcp.types import CallToolResult, TextContent

    server = MCPServer("python_sandbox", log_level="WARNING",
                       instructions=f"Runs Python code in a sandbox (isolation: {cfg.isolation}). {cfg.describe()}")
    slots = asyncio.Semaphore(cfg.max_parallel)
    description = ("Run a Python 3 program in a fresh process and return what it prints (stdout, "
                   "stderr) and its exit status. Use print() to see values. " + cfg.describe())

    @server.tool(description=description)
    async def run_python(code: str) -> Annotated[CallToolResult, RunResult]:
        if len(code) > MAX_CODE_CHARS:
            raise ToolError(f"code longer than {MAX_CODE_CHARS} characters")
        async with slots:
            try:
                result = await run_code(code, cfg)
            except (OSError, SandboxError) as err:  # e.g. the interpreter or unshare vanished since startup
                raise ToolError(f"could not start the sandbox process: {err}") from None
        return CallToolResult(content=[TextContent(type="text", text=format_result(result, cfg))],
                              structured_content=result.model_dump())

    return server


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    env = os.environ.get
    parser = argparse.ArgumentParser(description="Python sandbox MCP server (run_python).")
    parser.add_argument("--cpu-seconds", type=int, default=int(env("RL_FACTORY_SANDBOX_CPU_S", 5)))
    parser.add_argument("--memory-mb", type=int, default=int(env("RL_FACTORY_SANDBOX_MEMORY_MB", 1024)))
    parser.add_argument("--timeout-s", type=float, default=float(env("RL_FACTORY_SANDBOX_TIMEOUT_S", 10)))
    parser.add_argument("--max-output-bytes", type=int,
                        default=int(env("RL_FACTORY_SANDBOX_MAX_OUTPUT_BYTES", 4096)))
    parser.add_argument("--max-parallel", type=int, default=int(env("RL_FACTORY_SANDBOX_MAX_PARALLEL", 4)))
    parser.add_argument("--max-processes", type=int, default=64, help="RLIMIT_NPROC of a run")
    parser.add_argument("--max-file-mb", type=int, default=16, help="RLIMIT_FSIZE of a run")
    parser.add_argument("--tmp-mb", type=int, default=64, help="size of a run's private /tmp (namespaces)")
    parser.add_argument("--isolation", choices=MODES, default=env("RL_FACTORY_SANDBOX_ISOLATION", "namespaces"),
                        help="namespaces (default; refuses to start where it cannot be had) | process (weaker)")
    parser.add_argument("--engine", choices=ENGINES, default=env("RL_FACTORY_SANDBOX_ENGINE", "auto"),
                        help="namespaces mode's engine: auto (bwrap where installed, else unshare) | bwrap | unshare")
    parser.add_argument("--ro-path", action="append", dest="ro_paths",
                        default=[p for p in env("RL_FACTORY_SANDBOX_RO_PATHS", "").split(":") if p],
                        help="a host path the code may read (namespaces; repeatable)")
    parser.add_argument("--python", default=sys.executable, help="interpreter that runs the code")
    parser.add_argument("--transport", choices=["stdio", "streamable-http", "sse"], default="stdio")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args(argv)
    if args.cpu_seconds < 1 or args.memory_mb < 64 or args.timeout_s <= 0 or args.max_parallel < 1 \
            or args.max_output_bytes < 64 or args.max_processes < 2 or args.max_file_mb < 1 or args.tmp_mb < 1:
        parser.error("need --cpu-seconds >= 1, --memory-mb >= 64, --timeout-s > 0, --max-parallel >= 1, "
                     "--max-output-bytes >= 64, --max-processes >= 2, --max-file-mb >= 1, --tmp-mb >= 1")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.isolation == "namespaces":
        missing = [p for p in args.ro_paths if not os.path.exists(p)]
        if missing:
            sys.exit(f"python_sandbox: --ro-path {missing[0]}: no such file or directory")
        reason = probe_namespaces(args.python, with_targets(args.ro_paths), args.engine)
        if reason is not None:
            sys.exit(refusal(reason))
    cgroup = RunCgroups.find()
    if not cgroup.has("memory"):
        print(f"python_sandbox: no memory cgroup can be created here: --memory-mb {args.memory_mb} caps each "
              "process's address space only, not memory held in memfds, shared memory or files", file=sys.stderr)
    cfg = SandboxConfig(cpu_seconds=args.cpu_seconds, memory_mb=args.memory_mb, timeout_s=args.timeout_s,
                        max_output_bytes=args.max_output_bytes, max_parallel=args.max_parallel,
                        max_processes=args.max_processes, max_file_mb=args.max_file_mb, tmp_mb=args.tmp_mb,
                        isolation=args.isolation, engine=args.engine, python=args.python, cgroup=cgroup,
                        ro_paths=with_targets(args.ro_paths))
    server = build_server(cfg)
    serve(server, args.transport, args.host, args.port)


if __name__ == "__main__":
    main()
