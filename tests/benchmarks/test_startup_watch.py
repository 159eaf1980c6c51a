"""benchmarks/startup_watch.py files each py-spy sample under the start-up phase its time falls in."""
from benchmarks.startup_watch import busiest_frames, phase_at, summarize, where

MARKS = {"process_started": 100.0, "launcher_entered": 105.0, "ray_initialized": 120.0,
         "trainer_constructing": 150.0, "rollout_servers_started": 300.0}


def frame(name, filename, line=1):
    return {"name": name, "filename": filename, "short_filename": filename.rsplit("site-packages/", 1)[-1],
            "line": line}


def test_a_sample_belongs_to_the_phase_that_ends_with_the_next_mark():
    assert phase_at(101.0, MARKS) == "cli"
    assert phase_at(130.0, MARKS) == "trainer_config"  # verl's trainer_constructing ends that phase
    assert phase_at(299.9, MARKS) == "rollout_servers"
    assert phase_at(301.0, MARKS) == "after_last_mark"


def test_the_busiest_thread_is_the_one_holding_the_gil():
    idle = {"thread_name": "MainThread", "owns_gil": False, "active": False,
            "frames": [frame("wait", "/usr/lib/python3.11/threading.py")]}
    busy = {"thread_name": "Thread-2", "owns_gil": True, "active": True,
            "frames": [frame("compile", "/x/site-packages/torch/_inductor/compile_fx.py"),
                       frame("load_model", "/x/site-packages/vllm/worker/gpu_model_runner.py", 7)]}
    frames = busiest_frames([idle, busy])
    assert frames[0]["name"] == "compile"
    # below torch's internals, the sample is spent in vLLM's model load
    assert where(frames) == "load_model (vllm/worker/gpu_model_runner.py:7)"
    assert where([]) == "(no frames)"


def test_summary_counts_samples_per_phase_and_process():
    samples = [{"t": 130.0, "role": "TaskRunner", "pid": 1, "where": "init (transfer_queue/interface.py:200)",
                "stack": ["a", "b"]}] * 3 + [
               {"t": 200.0, "role": "EngineCore", "pid": 2, "where": "compile (vllm/compilation/backends.py:9)",
                "stack": ["c"]},
               {"t": 200.0, "role": "TaskRunner", "pid": 1, "where": "get (ray/_private/worker.py:1)", "stack": ["d"]}]
    summary = summarize(samples, MARKS, top=2)
    assert summary["trainer_config"]["TaskRunner"] == {
        "samples": 3, "where": [["init (transfer_queue/interface.py:200)", 3]], "stacks": [["a < b", 3]]}
    assert set(summary["rollout_servers"]) == {"EngineCore", "TaskRunner"}


def test_a_workers_samples_before_its_actor_started_are_filed_under_that_actor():
    samples = [{"t": 130.0, "role": "IDLE", "pid": 7, "where": "<module> (vllm/config/model.py:30)", "stack": ["i"]},
               {"t": 131.0, "role": "IDLE", "pid": 8, "where": "main_loop (ray/_private/worker.py:1)", "stack": ["w"]},
               {"t": 200.0, "role": "WorkerDict", "pid": 7, "where": "init (verl/workers/x.py:1)", "stack": ["a"]}]
    summary = summarize(samples, MARKS, top=2)
    assert summary["trainer_config"]["WorkerDict (starting)"]["where"] == [["<module> (vllm/config/model.py:30)", 1]]
    assert "IDLE" in summary["trainer_config"]  # pid 8 never became an actor
    assert summary["rollout_servers"]["WorkerDict"]["samples"] == 1
