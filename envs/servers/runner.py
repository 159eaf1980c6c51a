"""The program that runs the sandbox's code inside its process: RUNNER (`python -c RUNNER SETTINGS`).

It reads the code from stdin (so the working directory starts empty), sets the run's rlimits
(process and bwrap engines; namespaces' INIT sets them itself), installs the socket stub (process
mode), and execs the code with tracebacks that show only the user's frames. Under bwrap it first
becomes the run's user (`nobody` when the server is root) and forks: the parent waits for the
code's process and writes how it ended ("exit N" / "signal S") to the status pipe, as INIT does
for the namespaces engine, so a signal is never confused with an exit status.
"""

RUNNER = r"""
import json, os, resource, sys
settings = json.loads(sys.argv[1])
status_fd = settings.get("status_fd")
if status_fd is not None:
    report = lambda line: os.write(status_fd, (line + "\n").encode())
    try:
        uid = settings.get("uid")
        if uid is not None:  # root under bwrap: become nobody, which clears every capability ...
            import ctypes
            prctl = ctypes.CDLL(None, use_errno=True).prctl
            for cap in range(int(open("/proc/sys/kernel/cap_last_cap").read()) + 1):
                prctl(24, cap, 0, 0, 0)  # ... and PR_CAPBSET_DROP: none can come back
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
            header, data = (ctypes.c_uint32 * 2)(0x20080522, 0), (ctypes.c_uint32 * 6)()
            if ctypes.CDLL(None, use_errno=True).capset(header, data) != 0:  # the inheritable set too
                raise OSError(ctypes.get_errno(), "capset")
            prctl(4, 1, 0, 0, 0)  # PR_SET_DUMPABLE, which setuid cleared: its /proc/self is its own again
        child = os.fork()
    except OSError as err:
        report("setup %s: %s" % (type(err).__name__, err))
        os._exit(0)
    if child:
        _, st = os.waitpid(child, 0)
        report("signal %d" % os.WTERMSIG(st) if os.WIFSIGNALED(st) else "exit %d" % os.WEXITSTATUS(st))
        os._exit(0)
    os.close(status_fd)
import linecache, traceback
for name, (soft, hard) in settings["rlimits"].items():
    resource.setrlimit(getattr(resource, name), (soft, hard))
stub = settings["socket_stub"]
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
