"""benchmarks/pyspy_watch.py's CPU side: it finds verl's processes by role and reads py-spy's raw profiles."""
from __future__ import annotations

import subprocess
import sys
import time

import pytest

from benchmarks.pyspy_watch import processes, py_spy, top_frames


def test_innermost_frames_are_counted_by_their_share_of_samples(tmp_path):
    raw = tmp_path / "WorkerDict-1.txt"
    raw.write_text("main (a.py:1);step (b.py:2);forward (c.py:3) 60\n"
                   "main (a.py:1);step (b.py:2);synchronize (d.py:4) 30\n"
                   "main (a.py:1);forward (c.py:3) 10\n")
    assert top_frames(raw) == {"samples": 100, "top": [["forward (c.py:3)", 0.7], ["synchronize (d.py:4)", 0.3]]}


def test_a_profile_with_threads_gives_each_threads_share_and_its_own_frames(tmp_path):
    raw = tmp_path / "EngineCore-1.txt"  # py-spy record --threads: each stack starts with its thread
    raw.write_text("thread (11): MainThread;run_busy_loop (core.py:1);step (core.py:2) 70\n"
                   "thread (11): MainThread;run_busy_loop (core.py:1);poll (core.py:3) 10\n"
                   "thread (12): Thread-1 (process_output_sockets);run (threading.py:1);send (zmq.py:5) 15\n"
                   "thread (13): Thread-2 (idle) 5\n")
    frames = top_frames(raw)
    assert frames["samples"] == 100 and frames["top"][0] == ["step (core.py:2)", 0.7]
    assert list(frames["threads"]) == ["MainThread", "Thread-1 (process_output_sockets)", "Thread-2 (idle)"]
    assert frames["threads"]["MainThread"] == {"share": 0.8, "top": [["step (core.py:2)", 0.875],
                                                                     ["poll (core.py:3)", 0.125]]}
    assert frames["threads"]["Thread-2 (idle)"]["top"] == [["(no Python frame)", 1.0]]
    # without --threads, no thread table
    raw.write_text("main (a.py:1);step (b.py:2) 3\n")
    assert "threads" not in top_frames(raw)


def test_a_process_is_found_by_the_role_its_command_line_names():
    # Ray names an actor's process after its class ("ray::WorkerDict.compute_log_prob")
    before = processes()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", "ray::WorkerDict"])
    try:
        time.sleep(0.2)
        found = processes()
        # the first such process: this one, unless one was running already
        assert found["WorkerDict"] == before.get("WorkerDict", child.pid)
        assert child.pid not in [pid for role, pid in found.items() if role != "WorkerDict"]
    finally:
        child.kill()
        child.wait()


def test_the_prestarted_agent_loop_worker_is_found_as_the_agent_loop_worker():
    """Ray names an actor's process after its class: the prestarted worker's name carries the role (as `_Worker` it
    was missed, and the H100 profile at 58270373a9cd had no agent-loop worker)."""
    pytest.importorskip("verl")
    from benchmarks.pyspy_watch import ROLES
    from rl_factory.backends.verl.prestart import AgentLoopWorkerPrestarted

    assert [role for role in ROLES if role in f"ray::{AgentLoopWorkerPrestarted.__name__}"] == ["AgentLoopWorker"]


@pytest.mark.skipif(py_spy() is None, reason="py-spy is not installed (pip install py-spy)")
def test_a_run_reaching_its_step_is_sampled(tmp_path):
    child = subprocess.Popen([sys.executable, "-c", "import time\nwhile True: sum(range(999))", "ray::WorkerDict"])
    try:
        (tmp_path / "runs" / "r").mkdir(parents=True)
        watch = subprocess.Popen([sys.executable, "benchmarks/pyspy_watch.py", "--runs", str(tmp_path / "runs"),
                                  "--seconds", "2", "--timeout", "30", "--out", str(tmp_path / "out")],
                                 stdout=subprocess.PIPE, text=True)
        time.sleep(1)
        (tmp_path / "runs" / "r" / "metrics.jsonl").write_text('{"step": 2}\n')
        out, _ = watch.communicate(timeout=60)
        assert watch.returncode == 0
        assert '"WorkerDict"' in out and any((tmp_path / "out").glob("WorkerDict-*.txt"))
    finally:
        child.kill()
        child.wait()
