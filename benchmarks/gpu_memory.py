"""The peak GPU memory a job used, read from the driver (nvidia-smi) while it runs.

Frameworks split a step's memory differently: verl keeps its vLLM server, FSDP actor and Ray workers in
separate processes (each torch allocator sees only its own share), TRL keeps vLLM inside its trainer's
process. What the device itself reports as used, sampled every `interval` seconds, is the one number that
means the same on both sides.

    with DevicePeak() as peak:
        subprocess.run(job)
    peak.result()   # {"peak_used_gb": ..., "total_gb": ..., "baseline_used_gb": ..., "samples": ...} or None

GiB, as verl's and torch's `*_gb` figures. Without nvidia-smi (CPU machines) the result is None. Each sample also
reads the SM clock, the power, the temperature and the driver's throttle reasons, and the host's load: `clocks` in
the result, `per_step` over a job's steps, the samples themselves in `write_timeline`.
"""
from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from rl_factory.jsonl import read_records


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


# What each sample reads beside the memory: whether the GPU ran at its clocks while a step was slow. One launch's
# steps slowed in every phase together by 1.3-1.9x on an H100 (58270373a9cd), the GPU's own update as much as vLLM's
# CPU-bound decode: the clocks, the power and the driver's throttle reasons say whether the GPU was held back.
CLOCK_FIELDS = ("clocks.sm", "clocks.max.sm", "power.draw", "temperature.gpu")
# the driver's active clock-event reasons (nvidia-smi's newer name first, then the older one), by NVML bit
REASON_FIELDS = ("clocks_event_reasons.active", "clocks_throttle_reasons.active")
REASONS = {0x2: "applications_clocks", 0x4: "sw_power_cap", 0x8: "hw_slowdown", 0x10: "sync_boost",
           0x20: "sw_thermal", 0x40: "hw_thermal", 0x80: "hw_power_brake", 0x100: "display_clocks"}  # 0x1: idle


def _number(text: str) -> float | None:
    text = text.strip()
    try:
        return float(int(text, 16)) if text.lower().startswith("0x") else float(text)
    except ValueError:  # "[N/A]", "[Not Supported]"
        return None


def _query(index: str, fields: tuple[str, ...]) -> list[float | None] | None:
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits",
                              "-i", index], capture_output=True, text=True, timeout=10, check=True).stdout
        values = [_number(x) for x in out.strip().splitlines()[0].split(",")]
    except (OSError, subprocess.SubprocessError, IndexError):
        return None
    return values if len(values) == len(fields) else None


def used_and_total_mib(index: str) -> tuple[float, float] | None:
    read = _query(index, ("memory.used", "memory.total"))
    return (read[0], read[1]) if read and None not in read else None


def read_device(index: str, fields: tuple[str, ...] | None = None
                ) -> tuple[dict[str, Any] | None, tuple[str, ...] | None]:
    """One sample of the device (MiB, MHz, W, C, the reasons' bitmask) and the fields the driver answered (None: no
    answer), tried from the most to the fewest (the memory alone where the clocks' fields are unknown to it)."""
    tries = [fields] if fields else [("memory.used", "memory.total", *CLOCK_FIELDS, reason) for reason in REASON_FIELDS]
    for attempt in [*tries, ("memory.used", "memory.total")]:
        values = _query(index, attempt)
        if values is not None and values[0] is not None:
            return dict(zip(("used", "total", "sm_mhz", "max_sm_mhz", "power_w", "temp_c", "reasons"), values)), attempt
    return None, None


def clocks_summary(samples: list[dict[str, Any]]) -> dict[str, Any] | None:
    """What the samples of one window say of the clocks: the SM clock's least and median against its maximum, the
    median power, the highest temperature, every throttle reason seen (idle aside) and the host's highest load."""
    clocks = [s["sm_mhz"] for s in samples if s.get("sm_mhz") is not None]
    if not clocks:
        return None
    seen = 0
    for s in samples:
        seen |= int(s.get("reasons") or 0)
    power = [s["power_w"] for s in samples if s.get("power_w") is not None]
    temps = [s["temp_c"] for s in samples if s.get("temp_c") is not None]
    loads = [s["load_1m"] for s in samples if s.get("load_1m") is not None]
    return {"samples": len(samples), "sm_mhz_min": min(clocks), "sm_mhz_median": statistics.median(clocks),
            "sm_mhz_max_rated": max((s.get("max_sm_mhz") or 0 for s in samples), default=None) or None,
            "power_w_median": statistics.median(power) if power else None, "temp_c_max": max(temps, default=None),
            "reasons": [name for bit, name in REASONS.items() if seen & bit], "host_load_1m_max": max(loads, default=None)}


def per_step(samples: list[dict[str, Any]], step_end_unix: dict[int, float], steps: list[int]) -> dict[str, Any]:
    """`clocks_summary` of each of `steps`: the samples after the step before it ended and up to its own end."""
    out = {}
    for step in steps:
        end, start = step_end_unix.get(step), step_end_unix.get(step - 1)
        if end is None or start is None:
            continue
        summary = clocks_summary([s for s in samples if start < s["unix"] <= end])
        if summary is not None:
            out[str(step)] = summary
    return out


class Sampler:
    """Calls `sample_once` every `interval` seconds in a thread between __enter__ and __exit__, where `available()`
    (the tool or the files it reads exist here)."""

    interval: float = 0.5

    def available(self) -> bool:
        return True

    def sample_once(self) -> None:
        raise NotImplementedError

    def __enter__(self):
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if self.available():
            self._thread = threading.Thread(target=self._poll, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *_exc: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=15)

    def _poll(self) -> None:
        while True:
            self.sample_once()
            if self._stop.wait(self.interval):
                return


class DevicePeak(Sampler):
    """Samples the device's used memory, clocks, power and throttle reasons (and the host's load) in a thread
    between __enter__ and __exit__."""

    def __init__(self, interval: float = 0.5, index: str | None = None):
        self.interval, self.index = interval, index or gpu_index()
        self.samples: list[float] = []
        self.timeline: list[dict[str, Any]] = []  # each sample, with its unix time and the host's 1-minute load
        self.total: float | None = None
        self._fields: tuple[str, ...] | None = None  # the fields the driver answered first, from then on

    def available(self) -> bool:
        return shutil.which("nvidia-smi") is not None

    def sample_once(self) -> None:
        read, answered = read_device(self.index, self._fields)
        self._fields = self._fields or answered
        if read is not None:
            self.samples.append(read["used"])
            self.total = read["total"]
            self.timeline.append({**read, "unix": time.time(), "load_1m": os.getloadavg()[0]})

    def write_timeline(self, path: Path) -> None:
        """Every sample, one JSON line each (a run directory's `device_timeline.jsonl`)."""
        if self.timeline:
            path.write_text("".join(json.dumps(s) + "\n" for s in self.timeline))

    def result(self) -> dict[str, Any] | None:
        if not self.samples:
            return None
        gib = lambda mib: round(mib / 1024, 2)  # noqa: E731
        return {"peak_used_gb": gib(max(self.samples)), "total_gb": gib(self.total or 0),
                "baseline_used_gb": gib(self.samples[0]), "samples": len(self.samples),
                "interval_s": self.interval, "clocks": clocks_summary(self.timeline)}


DEVICE_TIMELINE = "device_timeline.jsonl"  # a benchmark run's device samples, in its run directory


def run_per_step(run_dir: Path, steps: list[int], launched: float) -> dict[str, Any]:
    """`per_step` over a gpu_step run's device samples and its steps' ends ({} without nvidia-smi)."""
    from benchmarks.step_metrics import step_ends

    path = run_dir / DEVICE_TIMELINE
    if not path.exists():
        return {}
    samples = read_records(path)
    return per_step(samples, step_ends(run_dir / "bench_stdout.log", launched), steps)
