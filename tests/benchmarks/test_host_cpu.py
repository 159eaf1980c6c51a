"""benchmarks/host_cpu.py: the cores a job's processes used, read from /proc while real processes run."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from benchmarks.gpu_memory import JOB_MARK_VAR
from benchmarks.host_cpu import (HOST_CPU_TIMELINE, JobCpu, process_name, read_timeline, rollout_windows, run_rollouts,
                                 window)
from rl_factory.jsonl import dumps

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="reads Linux's /proc")

BUSY = "import time\nend = time.time() + {s}\nwhile time.time() < end: pass\n"
IDLE = "import time; time.sleep({s})"


def start(code: str, mark: str | None) -> subprocess.Popen:
    env = dict(os.environ, **({JOB_MARK_VAR: mark} if mark else {}))
    return subprocess.Popen([sys.executable, "-c", code], env=env)


def test_the_jobs_busy_process_shows_its_core_and_a_process_outside_the_job_is_not_listed(tmp_path):
    mark = str(tmp_path / "run")
    with JobCpu(mark, interval=0.1) as cpu:
        busy, idle, outside = (start(BUSY.format(s=2.0), mark), start(IDLE.format(s=2.0), mark),
                               start(IDLE.format(s=2.0), None))
        began = time.time()
        for proc in (busy, idle, outside):
            proc.wait(timeout=30)
        ended = time.time()
    rows = window(cpu.timeline, began + 0.5, ended - 0.3)
    assert rows is not None and rows["seconds"] > 0.5
    by_pid = {r["pid"]: r for r in rows["processes"]}
    assert outside.pid not in by_pid  # no mark in its environment
    # a spinning Python loop keeps most of a core even on a loaded 2-core machine; a sleeping one none
    assert by_pid[busy.pid]["cores"] > 0.3 and by_pid[idle.pid]["cores"] < 0.1
    assert rows["processes"][0]["pid"] == busy.pid  # the busiest first
    assert by_pid[busy.pid]["name"].startswith("python") and "-c" in by_pid[busy.pid]["name"]
    busy_row = by_pid[busy.pid]
    if busy_row["cores"] >= 0.5:  # threads are listed where the process kept half a core: its one did the work
        assert busy_row["threads"][0]["cores"] > 0.3
    else:  # a 2-core machine loaded by other tests can hold the spinning loop under half a core
        assert "threads" not in busy_row
    # threads are read for a busy process only: the job's thread pools would fill the file otherwise
    held = [s["processes"] for s in cpu.timeline]
    assert any("threads" in p.get(str(busy.pid), {}) for p in held)
    assert not any("threads" in p.get(str(idle.pid), {}) for p in held) and "threads" not in by_pid[idle.pid]
    assert rows["host_busy_cores"] >= by_pid[busy.pid]["cores"] - 0.2 and rows["host_steal_cores"] >= 0
    assert rows["sampler_read_s"] >= 0


def test_a_window_needs_two_samples_inside_it():
    samples = [{"unix": t, "host_busy_s": None, "processes": {}} for t in (10.0, 11.0, 12.0)]
    assert window(samples, 10.5, 11.5) is None  # one sample inside: no interval to read
    assert window(samples, 10.0, 12.0)["seconds"] == 2.0
    assert window(samples, 10.0, 12.0)["host_busy_cores"] is None  # the host's figure where /proc/stat was unread
    assert window(samples, 10.0, 12.0)["host_steal_cores"] is None


def test_a_process_retitled_by_its_framework_is_named_by_its_title(tmp_path):
    for pid, cmdline, name in ((1, b"ray::TaskRunner.run extra words\0", "ray::TaskRunner.run"),
                               (2, b"/usr/bin/python3\0-m\0vllm\0", "python3 -m"),
                               (3, b"", "?")):
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "cmdline").write_bytes(cmdline)
        assert process_name(pid, str(tmp_path)) == name
    assert process_name(4, str(tmp_path)) == "?"  # gone


def test_each_steps_rollout_window_and_its_figures_come_from_the_run_directory(tmp_path):
    (tmp_path / "rollouts").mkdir()
    # the model's text as the rollouts writer keeps it: U+2028 and U+0085 raw, which str.splitlines() breaks on
    text = [{"role": "assistant", "content": "a\u2028b\x85c"}]
    lines = [{"messages": text, "timing": {"started_unix": 100.0, "wall_s": 2.0}},
             {"messages": text, "timing": {"started_unix": 100.5, "wall_s": 3.5}}]
    (tmp_path / "rollouts" / "step_000002.jsonl").write_text("".join(dumps(x) for x in lines), encoding="utf-8")
    (tmp_path / "rollouts" / "step_000003.jsonl").write_text(json.dumps({"timing": {}}) + "\n")  # no clocks
    assert rollout_windows(tmp_path, [2, 3, 4]) == {2: (100.0, 104.0)}
    proc = {"name": "VLLM::EngineCore", "voluntary": 0, "involuntary": 0, "threads": {"7": ["VLLM::EngineCor", 0.0]}}
    samples = [{"unix": t, "host_busy_s": 4.0 * t, "host_steal_s": 0.5 * t, "read_s": 0.01,
                "processes": {"7": {**proc, "cpu_s": 0.9 * t, "involuntary": int(10 * t),
                                    "threads": {"7": ["VLLM::EngineCor", 0.9 * t]}}}}
               for t in (99.0, 101.0, 103.0, 105.0)]
    (tmp_path / HOST_CPU_TIMELINE).write_text("".join(json.dumps(s) + "\n" for s in samples))
    assert len(read_timeline(tmp_path / HOST_CPU_TIMELINE)) == 4
    got = run_rollouts(tmp_path, [2, 3])
    assert list(got) == ["2"]  # step 3's lines say nothing of when it ran
    step = got["2"]
    assert step["seconds"] == 2.0 and step["host_busy_cores"] == 4.0 and step["job_cores"] == 0.9
    assert step["host_steal_cores"] == 0.5
    engine = step["processes"][0]
    assert engine["name"] == "VLLM::EngineCore" and engine["cores"] == 0.9 and engine["involuntary_per_s"] == 10.0
    assert engine["threads"] == [{"name": "VLLM::EngineCor", "cores": 0.9}]
    assert run_rollouts(tmp_path / "elsewhere", [2]) == {}  # a run without the sampler's file


def test_a_process_found_late_is_measured_from_the_first_sample_that_holds_it():
    def sample(t, processes):
        return {"unix": t, "host_busy_s": None, "processes": processes}

    def proc(cpu_s):
        return {"name": "p", "cpu_s": cpu_s, "voluntary": 0, "involuntary": 0, "threads": {}}

    # pid 8 had used 50 s of CPU before the sampler first read it: counting from 0 would say 25 cores
    samples = [sample(0.0, {"7": proc(0.0)}), sample(1.0, {"7": proc(1.0), "8": proc(50.0)}),
               sample(2.0, {"7": proc(2.0), "8": proc(50.5)}), sample(3.0, {"7": proc(3.0), "9": proc(9.0)})]
    rows = {r["pid"]: r["cores"] for r in window(samples[:3], 0.0, 2.0)["processes"]}
    assert rows == {7: 1.0, 8: 0.5}
    assert 9 not in {r["pid"] for r in window(samples, 0.0, 3.0)["processes"]}  # only in the last sample


def test_a_section_that_fails_is_an_error_in_the_record_and_the_summary_passes_over_it(tmp_path, capsys):
    from benchmarks.host_cpu import summary
    from benchmarks.record import diagnostic

    (tmp_path / "rollouts").mkdir()
    (tmp_path / "rollouts" / "step_000002.jsonl").write_text('{"timing": {"started_unix": 1.0, "wall_s": 2\n')  # torn
    got = diagnostic("host_cpu_in_rollout", rollout_windows, tmp_path, [2])
    assert got["error"].startswith("JSONDecodeError: ")
    assert "host_cpu_in_rollout: left out of the record (JSONDecodeError" in capsys.readouterr().err
    assert diagnostic("host_cpu_in_rollout", rollout_windows, tmp_path, [3]) == {}  # no file: nothing, no error
    assert summary(got) is None  # ab.py's summary of such a record
