"""Python sandbox MCP server: `run_python(code)` runs a program in a fresh, limited process.

Each call starts a new interpreter (this server's own, so the venv's packages import) in a new
temporary working directory that is deleted afterwards, with:
  * CPU time capped by RLIMIT_CPU (SIGXCPU at the limit, SIGKILL a second later);
  * address space capped by RLIMIT_AS, so a huge allocation raises MemoryError;
  * a wall-clock timeout, after which the whole process group is killed (also at the end of
    every run, so background children do not outlive their call);
  * no network: in a new network namespace (`unshare --map-root-user --net`, or `unshare --net`
    when user namespaces are off but we are root) where only a downed loopback exists, when
    that works here (checked once at startup); otherwise socket.socket (for AF_INET/AF_INET6)
    and socket.create_connection are replaced by a stub that raises PermissionError before the
    code runs. The active mode is named in the tool description and the server instructions;
  * stdout and stderr captured separately, each cut to its first and last bytes around a
    `[... N bytes truncated ...]` marker; a run printing more than 16 MiB is killed.

The code's own outcome (an exception, a limit hit, a non-zero exit) is a normal result, not a
tool error: the tool did its job and the model reads what happened. The result text is the
program's stdout, then `[stderr]` and its stderr, then one status line such as `[exit code 0]`
or `[killed: CPU time limit of 5 s exceeded]`; structured content carries the same fields.

Limits: this stops runaway and accidental code, not a determined attacker. The code runs as the
server's user and sees its filesystem; the socket stub can be undone from inside; RLIMITs can be
raised by code running as real root (not in the `--map-root-user` mode).

Flags (or env vars, which the manifest must pass through `env`): --cpu-seconds
(RL_FACTORY_SANDBOX_CPU_S, 5), --memory-mb (RL_FACTORY_SANDBOX_MEMORY_MB, 1024), --timeout-s
(RL_FACTORY_SANDBOX_TIMEOUT_S, 10), --max-output-bytes (RL_FACTORY_SANDBOX_MAX_OUTPUT_BYTES, 4096
per stream), --max-parallel (RL_FACTORY_SANDBOX_MAX_PARALLEL, 4 runs at once; more calls wait),
--network auto|namespace|socket-stub (RL_FACTORY_SANDBOX_NETWORK, auto).
"""
import argparse
import asyncio
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Annotated

from pydantic import BaseModel

from envs.servers.stdio import serve

MAX_DRAIN_BYTES = 16 << 20  # per stream; past this the run is killed rather than read forever
MAX_CODE_CHARS = 200_000
READ_CHUNK = 1 << 16
DRAIN_AFTER_EXIT_S = 2.0  # an escaped grandchild may hold the pipes open: stop reading then
NAMESPACE_COMMANDS = [["unshare", "--map-root-user", "--net", "--"], ["unshare", "--net", "--"]]
NETWORK_MODES = ("auto", "namespace", "socket-stub")

# Runs inside the child: limits first, then the optional socket stub, then the code (read from
# stdin, so the working directory starts empty) with tracebacks that show only the user's frames.
RUNNER = r"""
import linecache, resource, sys, traceback
cpu_s, memory_bytes, stub = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "socket-stub"
resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))
resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
source = sys.stdin.read()
if stub:
    import errno, socket
    def _refuse(*args, **kwargs):
        raise PermissionError(errno.EACCES, "network access is disabled in this sandbox")
    class _LocalOnlySocket(socket.socket):
        def __init__(self, family=-1, type=-1, proto=-1, fileno=None):
            if fileno is None and family in (-1, socket.AF_INET, socket.AF_INET6):
                _refuse()
            super().__init__(family, type, proto, fileno)
    socket.socket = _LocalOnlySocket  # AF_UNIX stays usable: asyncio's event loop needs socketpair
    socket.create_connection = _refuse
linecache.cache["<code>"] = (len(source), None, source.splitlines(True), "<code>")
sys.argv = ["<code>"]
try:
    exec(compile(source, "<code>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
except SystemExit:
    raise
except BaseException as exc:
    traceback.print_exception(type(exc), exc, exc.__traceback__.tb_next)
    sys.exit(1)
"""


@dataclass
class SandboxConfig:
    cpu_seconds: int = 5
    memory_mb: int = 1024
    timeout_s: float = 10.0
    max_output_bytes: int = 4096
    max_parallel: int = 4
    network: str = "socket-stub"  # resolved: "namespace" or "socket-stub"
    prefix: list[str] = field(default_factory=list)  # the unshare command in namespace mode
    python: str = sys.executable

    def command(self) -> list[str]:
        return [*self.prefix, self.python, "-I", "-B", "-u", "-c", RUNNER,
                str(self.cpu_seconds), str(self.memory_mb << 20), self.network]

    def describe(self) -> str:
        how = ("its own network namespace" if self.network == "namespace"
               else "sockets to the network are disabled")
        return (f"Limits per call: {self.cpu_seconds} s CPU time, {self.memory_mb} MB memory, "
                f"{self.timeout_s:g} s wall clock, {self.max_output_bytes} bytes of output per "
                f"stream. No network access ({how}). Each call starts in a new empty directory; "
                "nothing persists between calls.")


class RunResult(BaseModel):
    status: str  # ok | error | cpu_limit | timeout | output_limit | signal
    exit_code: int  # the process's return code; negative: killed by that signal
    stdout: str
    stderr: str
    stdout_truncated: bool
    stderr_truncated: bool
    duration_s: float


class _Capture:
    """Keeps a stream's first and last bytes (max_bytes in all) and counts what it drops."""

    def __init__(self, max_bytes: int):
        self.head_max, self.tail_max = max_bytes // 2, max_bytes - max_bytes // 2
        self.head, self.tail, self.total = bytearray(), bytearray(), 0

    def add(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = self.head_max - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        self.tail += chunk
        if len(self.tail) > self.tail_max:
            del self.tail[:len(self.tail) - self.tail_max]

    @property
    def truncated(self) -> bool:
        return self.total > len(self.head) + len(self.tail)

    def text(self) -> str:
        head, tail = self.head.decode(errors="replace"), self.tail.decode(errors="replace")
        if not self.truncated:
            return head + tail
        dropped = self.total - len(self.head) - len(self.tail)
        return f"{head}\n[... {dropped} bytes truncated ...]\n{tail}"


def detect_network(requested: str, python: str = sys.executable) -> tuple[str, list[str]]:
    """The isolation mode to use and its command prefix; raises RuntimeError if `namespace`
    was asked for and does not work here."""
    if requested != "socket-stub":
        for prefix in NAMESPACE_COMMANDS:
            try:
                probe = subprocess.run([*prefix, python, "-c", "pass"], timeout=10,
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            except (OSError, subprocess.TimeoutExpired):
                continue
            if probe.returncode == 0:
                return "namespace", prefix
        if requested == "namespace":
            raise RuntimeError("--network namespace: `unshare --net` does not work here "
                               "(needs util-linux and user namespaces or root)")
    return "socket-stub", []


def _child_env(workdir: str) -> dict[str, str]:
    # Nothing of the server's environment (API keys, ...) reaches the code.
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": workdir, "TMPDIR": workdir,
            "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "OMP_NUM_THREADS": "1",
            "OPENBLAS_NUM_THREADS": "1", "MPLBACKEND": "Agg"}


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # already gone


async def _drain(stream: asyncio.StreamReader, capture: _Capture, on_flood) -> None:
    while chunk := await stream.read(READ_CHUNK):
        capture.add(chunk)
        if capture.total > MAX_DRAIN_BYTES:
            on_flood()
            return


async def run_code(code: str, cfg: SandboxConfig) -> RunResult:
    """Run `code` in a fresh limited process and report what it printed and how it ended."""
    workdir = tempfile.mkdtemp(prefix="rlf-sandbox-")
    start, proc = time.monotonic(), None
    try:
        proc = await asyncio.create_subprocess_exec(
            *cfg.command(), cwd=workdir, env=_child_env(workdir), start_new_session=True,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        killed_for: list[str] = []

        def flood() -> None:
            killed_for.append("output_limit")
            _kill_group(proc.pid)

        out, err = _Capture(cfg.max_output_bytes), _Capture(cfg.max_output_bytes)
        readers = [asyncio.create_task(_drain(proc.stdout, out, flood)),
                   asyncio.create_task(_drain(proc.stderr, err, flood))]
        try:
            proc.stdin.write(code.encode())
            await proc.stdin.drain()
            proc.stdin.close()
        except (BrokenPipeError, ConnectionResetError):
            pass  # the child died before reading: its exit status tells why
        try:
            await asyncio.wait_for(proc.wait(), cfg.timeout_s)
        except asyncio.TimeoutError:  # not the builtin TimeoutError before Python 3.11
            killed_for.append("timeout")
        _kill_group(proc.pid)  # the timed-out run, or children the code left behind
        await proc.wait()
        _, pending = await asyncio.wait(readers, timeout=DRAIN_AFTER_EXIT_S)
        for task in pending:
            task.cancel()
    finally:
        if proc is not None and proc.returncode is None:
            _kill_group(proc.pid)  # we were cancelled (e.g. the client gave up): no orphan run
        _remove(workdir)
    return RunResult(status=_status(proc.returncode, killed_for), exit_code=proc.returncode,
                     stdout=out.text(), stderr=err.text(), stdout_truncated=out.truncated,
                     stderr_truncated=err.truncated, duration_s=round(time.monotonic() - start, 3))


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
    """The MCP server object; `cfg.network` must already be resolved (see detect_network)."""
    from mcp.server.mcpserver import MCPServer
    from mcp.server.mcpserver.exceptions import ToolError
    from mcp.types import CallToolResult, TextContent

    server = MCPServer("python_sandbox", log_level="WARNING",
                       instructions=f"Runs Python code in a sandbox (network isolation: "
                                    f"{cfg.network}). {cfg.describe()}")
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
            except OSError as err:  # e.g. the interpreter or unshare vanished since startup
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
    parser.add_argument("--network", choices=NETWORK_MODES, default=env("RL_FACTORY_SANDBOX_NETWORK", "auto"))
    parser.add_argument("--python", default=sys.executable, help="interpreter that runs the code")
    parser.add_argument("--transport", choices=["stdio", "streamable-http", "sse"], default="stdio")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args(argv)
    if args.cpu_seconds < 1 or args.memory_mb < 64 or args.timeout_s <= 0 or args.max_parallel < 1 \
            or args.max_output_bytes < 64:
        parser.error("need --cpu-seconds >= 1, --memory-mb >= 64, --timeout-s > 0, "
                     "--max-parallel >= 1, --max-output-bytes >= 64")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    try:
        network, prefix = detect_network(args.network, args.python)
    except RuntimeError as err:
        sys.exit(f"python_sandbox: {err}")
    cfg = SandboxConfig(cpu_seconds=args.cpu_seconds, memory_mb=args.memory_mb,
                        timeout_s=args.timeout_s, max_output_bytes=args.max_output_bytes,
                        max_parallel=args.max_parallel, network=network, prefix=prefix,
                        python=args.python)
    server = build_server(cfg)
    serve(server, args.transport, args.host, args.port)


if __name__ == "__main__":
    main()
