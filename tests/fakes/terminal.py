"""Run a command on a pseudo-terminal, as a person at a shell would: progress bars only draw on a tty."""
import fcntl
import os
import pty
import select
import struct
import subprocess
import termios
import time


def run_in_terminal(args: list[str], cwd, env: dict | None = None, timeout_s: float = 180) -> tuple[int, str]:
    """(exit code, everything the command wrote to the terminal)."""
    master, slave = pty.openpty()
    # A fresh pty is 0x0; tqdm sizes its bar to the terminal and would draw nothing.
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 160, 0, 0))
    proc = subprocess.Popen(args, stdin=slave, stdout=slave, stderr=slave, cwd=cwd, env=env, close_fds=True)
    os.close(slave)
    out, deadline = b"", time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.2)
            if ready:
                try:
                    data = os.read(master, 65536)
                except OSError:  # EIO: the command exited and the terminal closed
                    break
                if not data:
                    break
                out += data
            elif proc.poll() is not None:
                break
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)
        os.close(master)
    return proc.returncode, out.decode("utf-8", errors="replace")
