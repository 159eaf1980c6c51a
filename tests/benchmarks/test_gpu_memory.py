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
