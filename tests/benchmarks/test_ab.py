"""benchmarks/ab.py on CPU: the comparison of two gpu_step lines, and both sides' commands composed."""
import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import ab

ROOT = Path(__file__).resolve().parents[2]


def recorded_line() -> dict:
    """The newest one-launch 0.6B gpu_step record of the repository (a GPU run): A."""
    lines = [json.loads(x) for x in (ROOT / "benchmarks/results/gpu_step.jsonl").read_text().splitlines() if x.strip()]
    return next(r for r in reversed(lines)
                if r.get("shape") == "qwen3-0.6b" and r.get("phases") and "this_launch" not in r)


def test_b_over_a_is_each_phase_and_the_steps_ratio():
    a_line = recorded_line()
    b_line = json.loads(json.dumps(a_line))
    b_line["step_s"] = a_line["step_s"] * 0.9
    b_line["phases"]["update_weights"]["s"] = a_line["phases"]["update_weights"]["s"] / 2
    b_line["phases"]["old_log_prob"]["s"] = float("nan")  # a phase B never timed: no ratio, not NaN
    a, b = ab.side(a_line), ab.side(b_line)
    got = ab.compare(a, b)
    assert got["step_s"] == 0.9 and got["update_weights"] == 0.5 and got["update"] == 1.0
    assert got["old_log_prob"] is None
    assert a["launch_to_first_step_s"] == a_line["startup"]["launch_to_first_step_s"]


def test_a_side_that_logged_vllms_iterations_carries_its_engine_steps():
    line = recorded_line()
    line["phases"]["generate"].pop("engine_steps", None)
    logged = json.loads(json.dumps(line))
    logged["phases"]["generate"]["engine_steps"] = {"steps": 1900, "mixed": {"steps": 40}}
    assert ab.side(logged)["engine_steps"]["mixed"]["steps"] == 40
    assert "engine_steps" not in ab.side(line)  # a launch that did not ask vLLM for them


def test_a_side_carries_the_cores_its_rollouts_used_by_process_name():
    line = recorded_line()  # an H200 launch sampled by host_cpu.py
    assert line.get("host_cpu_in_rollout"), "the newest 0.6B launch was sampled"
    cpu = ab.side(line)["host_cpu"]
    assert cpu["rollouts"] == len(line["host_cpu_in_rollout"])
    assert 0.9 < cpu["cores"]["VLLM::EngineCore"] < 1.1  # one core: vLLM's engine thread
    assert list(cpu["cores"].values()) == sorted(cpu["cores"].values(), reverse=True)  # the busiest first
    # the agent-loop workers of one name are added up, each rollout's, then the median over the rollouts
    workers = [sum(r["cores"] for r in step["processes"] if r["name"] == "ray::AgentLoopWorkerPrestarted")
               for step in line["host_cpu_in_rollout"].values()]
    assert cpu["cores"]["ray::AgentLoopWorkerPrestarted"] == round(statistics.median(workers), 2)
    unsampled = {k: v for k, v in line.items() if k != "host_cpu_in_rollout"}
    assert "host_cpu" not in ab.side(unsampled)  # a launch from before the sampler


def test_a_joined_line_compares_its_own_launch():
    """A measured with the ceilings and joined with an earlier launch (--a-ceilings --a-earlier): its headline numbers
    are both launches' medians; the comparison takes this launch's own."""
    own = recorded_line()
    joined = {**json.loads(json.dumps(own)), "launches": 2, "step_s": own["step_s"] * 3,
              "this_launch": {"step_s": own["step_s"], "phases": own["phases"]}}
    joined["phases"]["generate"]["s"] = own["phases"]["generate"]["s"] * 3
    assert ab.side(joined)["step_s"] == own["step_s"]
    assert ab.side(joined)["generate"] == own["phases"]["generate"]["s"]


def test_only_a_measures_the_ceilings_and_joins_an_earlier_launch(monkeypatch):
    captured = {}
    monkeypatch.setattr(ab, "run_side", lambda base, overrides, timeout: captured.setdefault(
        "sides", []).append((base, overrides)) or {"error": "not run", "command": base})
    monkeypatch.setattr("benchmarks.record.emit", lambda *a, **k: captured.setdefault("emitted", a))
    ab.main(["--a-ceilings", "--a-earlier", "earlier.jsonl", "x=1"])
    (a_base, a_over), (b_base, b_over) = captured["sides"]
    assert "--no-ceilings" not in a_base and a_base[a_base.index("--earlier") + 1] == "earlier.jsonl"
    assert "--no-ceilings" in b_base and "--earlier" not in b_base
    assert (a_over, b_over) == ([], ["x=1"])


def test_a_side_without_a_line_says_why_and_the_other_still_counts():
    error = {"error": "no line after 370 s", "command": ["gpu_step.py"]}
    assert ab.compare(error, ab.side(recorded_line())) == {k: None for k in ("step_s", *ab.PHASES)}


@pytest.mark.slow  # composes verl's config twice through main_grpo.sh
def test_both_sides_compose(tmp_path):
    pytest.importorskip("verl", reason="verl is an extra")
    awake = "actor_rollout_ref.rollout.free_cache_engine=false"
    done = subprocess.run([sys.executable, "benchmarks/ab.py", "--cfg-job", "--out", str(tmp_path), "--common", awake,
                           "actor_cache_at_sync=release"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    sides = [json.loads(x) for x in done.stdout.splitlines() if x.startswith("{")]
    assert [s["exit_code"] for s in sides] == [0, 0]
    assert "actor_cache_at_sync=release" not in sides[0]["command"] and "actor_cache_at_sync=release" in sides[1]["command"]
    # the common override on both sides, composed: vLLM awake on both, the cache kept (the default) on A only
    assert all(awake in s["command"] and s["tuned"]["actor_rollout_ref.rollout.free_cache_engine"] is False
               for s in sides)
    assert [s["tuned"]["actor_cache_at_sync"] for s in sides] == ["keep", "release"]
