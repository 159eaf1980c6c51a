"""benchmarks/gpu_memory.py: which processes a benchmark job left behind are the job's."""
from __future__ import annotations

import os
import subprocess
import sys

from benchmarks import gpu_step
from benchmarks.gpu_memory import JOB_MARK_VAR, job_processes


def test_a_jobs_processes_are_found_by_its_mark_in_their_environment_never_this_one(monkeypatch, tmp_path):
    monkeypatch.setenv(JOB_MARK_VAR, "job-a")  # this process carries it too, and is never the job's leftover
    sleep = [sys.executable, "-c", "import time; time.sleep(60)"]
    # each in a session of its own, as Ray's and vLLM's processes are: outside the job's process group
    marked = subprocess.Popen(sleep, env={**os.environ, JOB_MARK_VAR: "job-a"}, start_new_session=True)
    other = subprocess.Popen(sleep, env={**os.environ, JOB_MARK_VAR: "job-b"}, start_new_session=True)
    unmarked = subprocess.Popen(sleep, env={k: v for k, v in os.environ.items() if k != JOB_MARK_VAR},
                                start_new_session=True)
    try:
        found = job_processes("job-a")
        assert marked.pid in found and os.getpid() not in found
        assert other.pid not in found and unmarked.pid not in found
        assert marked.pid not in job_processes("job-")  # the whole value, not a prefix of it
    finally:
        for p in (marked, other, unmarked):
            p.kill()
            p.wait()
    assert marked.pid not in job_processes("job-a")


def test_the_launch_environment_marks_the_job_with_its_run_directory(tmp_path):
    env = gpu_step.launch_env(gpu_step.parse_args([]), tmp_path / "run")
    assert env[JOB_MARK_VAR] == str(tmp_path / "run")


def test_each_steps_clocks_say_whether_the_gpu_was_held_back():
    from benchmarks.gpu_memory import clocks_summary, per_step

    def sample(unix, sm, reasons=0x0, load=3.0):
        return {"unix": unix, "used": 5e4, "total": 81559.0, "sm_mhz": sm, "max_sm_mhz": 1980.0, "power_w": 400.0,
                "temp_c": 60.0, "reasons": reasons, "load_1m": load}

    samples = [sample(100.2, 1980), sample(100.7, 1980, 0x1), sample(103.4, 1980),  # step 2: full clocks (idle aside)
               sample(104.0, 1410, 0x4), sample(105.5, 1200, 0x4 | 0x20, load=9.5)]  # step 3: capped by power, heat
    steps = per_step(samples, {1: 100.0, 2: 103.5, 3: 106.0, 4: 109.0}, [2, 3, 4])
    assert steps["2"]["sm_mhz_min"] == 1980 and steps["2"]["reasons"] == []
    assert steps["3"] == {"samples": 2, "sm_mhz_min": 1200, "sm_mhz_median": 1305.0, "sm_mhz_max_rated": 1980.0,
                          "power_w_median": 400.0, "temp_c_max": 60.0, "reasons": ["sw_power_cap", "sw_thermal"],
                          "host_load_1m_max": 9.5}
    assert "4" not in steps  # no sample in it
    assert clocks_summary([{"unix": 1.0, "used": 1.0, "total": 2.0}]) is None  # a driver that answered memory only


def test_a_driver_without_the_newer_reason_field_is_read_through_the_older_one(tmp_path, monkeypatch):
    """A real nvidia-smi stand-in on PATH: it refuses `clocks_event_reasons` (older drivers), answers the rest."""
    import json
    import time

    from benchmarks.gpu_memory import DevicePeak, read_device

    fake = tmp_path / "nvidia-smi"
    fake.write_text(f"""#!{sys.executable}
import sys
query = next((a.split("=", 1)[1] for a in sys.argv if a.startswith("--query-gpu=")), "")
if "clocks_event_reasons" in query:
    sys.exit("Field \\"clocks_event_reasons.active\\" is not a valid field to query.")
answers = {{"memory.used": "51200", "memory.total": "81559", "clocks.sm": "1410", "clocks.max.sm": "1980",
           "power.draw": "[N/A]", "temperature.gpu": "61", "clocks_throttle_reasons.active": "0x0000000000000004"}}
print(", ".join(answers[f] for f in query.split(",")))
""")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    read, fields = read_device("0")
    assert fields[-1] == "clocks_throttle_reasons.active"
    assert read == {"used": 51200.0, "total": 81559.0, "sm_mhz": 1410.0, "max_sm_mhz": 1980.0, "power_w": None,
                    "temp_c": 61.0, "reasons": 4.0}
    with DevicePeak(interval=0.05) as device:
        time.sleep(0.4)
    result = device.result()
    assert result["peak_used_gb"] == 50.0 and result["clocks"]["reasons"] == ["sw_power_cap"]
    assert result["clocks"]["sm_mhz_min"] == 1410.0 and result["clocks"]["power_w_median"] is None
    device.write_timeline(tmp_path / "timeline.jsonl")
    lines = [json.loads(x) for x in (tmp_path / "timeline.jsonl").read_text().splitlines()]
    assert len(lines) == result["samples"] and all(line["unix"] > 0 and "load_1m" in line for line in lines)
