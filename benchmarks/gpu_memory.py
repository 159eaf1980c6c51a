"""The peak GPU memory a job used, read from the driver (nvidia-smi) while it runs.

Frameworks split a step's memory differently: verl keeps its vLLM server, FSDP actor and Ray workers in
separate processes (each torch allocator sees only its own share), TRL keeps vLLM inside its trainer's
process. What the device itself reports as used, sampled every `interval` seconds, is the one number that
means the same on both sides.

    with DevicePeak() as peak:
        subprocess.run(job)
    peak.result()   # {"peak_used_gb": ..., "total_gb": ..., "baseline_used_gb": ..., "samples": ...} or None

GiB, as verl's and torch's `*_gb` figures. Without nvidia-smi (CPU machines) the result is None.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
from typing import Any


LEFTOVER_WAIT_S = 20  # seconds a finished job's processes get to leave the GPU


def gpu_processes() -> list[int]:
    """The pids of every process holding a context on the GPUs ([] without nvidia-smi)."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [int(x) for x in out.split() if x.strip().isdigit()]


JOB_MARK_VAR = "RL_FACTORY_BENCH_JOB"  # in a benchmark job's environment: which processes are the job's


def job_processes(mark: str, proc: str = "/proc") -> list[int]:
    """The live processes whose environment carries `JOB_MARK_VAR=mark` (a job's launcher, and Ray's and vLLM's
    processes, which inherit its environment), this one excluded.

    A job that outlives its timeout is stopped through these, not through the pids nvidia-smi lists: where
    commands run in a PID namespace of their own, the driver's pids are not this namespace's. On the H200, when
    a 0.6B launch reached its --timeout and the pids nvidia-smi listed were killed, the `timeout` command that
    ran the benchmark died of SIGKILL with it, and the benchmark never wrote its record.
    """
    needle = f"{JOB_MARK_VAR}={mark}".encode()
    found = []
    for pid in filter(str.isdigit, os.listdir(proc)):
        if int(pid) == os.getpid():
            continue
        try:
            with open(f"{proc}/{pid}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    found.append(int(pid))
        except OSError:  # gone, or not ours to read
            continue
    return found


def wait_gone(probe, seconds: float):
    """`probe()` again every 0.5 s until it returns nothing or `seconds` pass; what it last returned."""
    deadline = time.time() + seconds
    left = probe()
    while left and time.time() < deadline:
        time.sleep(0.5)
        left = probe()
    return left


def gpu_index() -> str:
    """The device a one-GPU job runs on: the first of CUDA_VISIBLE_DEVICES, else 0."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    return visible or "0"


def used_and_total_mib(index: str) -> tuple[float, float] | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used,memory.total", "--format=csv,noheader,nounits",
                              "-i", index], capture_output=True, text=True, timeout=10, check=True).stdout
        used, total = (float(x) for x in out.strip().splitlines()[0].split(","))
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None
    return used, total


class DevicePeak:
    """Samples the device's used memory in a thread between __enter__ and __exit__."""

    def __init__(self, interval: float = 0.5, index: str | None = None):
        self.interval, self.index = interval, index or gpu_index()
        self.samples: list[float] = []
        self.total: float | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> "DevicePeak":
        if shutil.which("nvidia-smi") is not None:
            self._thread = threading.Thread(target=self._poll, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *_exc: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=15)

    def _poll(self) -> None:
        while True:
            read = used_and_total_mib(self.index)
            if read is not None:
                self.samples.append(read[0])
                self.total = read[1]
            if self._stop.wait(self.interval):
                return

    def result(self) -> dict[str, Any] | None:
        if not self.samples:
            return None
        gib = lambda mib: round(mib / 1024, 2)  # noqa: E731
        return {"peak_used_gb": gib(max(self.samples)), "total_gb": gib(self.total or 0),
                "baseline_used_gb": gib(self.samples[0]), "samples": len(self.samples),
                "interval_s": self.interval}
