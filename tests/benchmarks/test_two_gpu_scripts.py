"""The CPU side of the 2-GPU measurements (benchmarks/gpu_suite.sh two_gpu*): argument parsing, the
scaling summary and the job checks on made-up results and run directories, and two_gpu_checks.py's
launch / kill / restart / leftover machinery end to end around a stand-in job (tests/benchmarks/fake_verl_job.py)."""
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import scaling, two_gpu_checks
from benchmarks.gpu_step import parse_args as gpu_step_args
from benchmarks.gpu_step import verl_overrides

ROOT = Path(__file__).resolve().parents[2]
FAKE_JOB = Path(__file__).with_name("fake_verl_job.py")


def _gpu_step_line(gpus, tp, batch, gen_s, lp_s, upd_s, step_s, tokens, generated, shape="qwen3-0.6b"):
    return {"bench": "gpu_step", "shape": shape, "model": f"outputs/gpu_suite/model-{shape}", "agent_loop": "rl_factory",
            "lora_rank": 0, "gpus": gpus, "tp": tp, "batch": batch, "n": 8, "step_s": step_s, "all_step_s": [40.0, step_s],
            "phases": {"generate": {"s": gen_s, "generated_tokens": generated, "tokens_per_s": generated / gen_s},
                       "old_log_prob": {"s": lp_s, "tokens": tokens, "tokens_per_s": tokens / lp_s},
                       "update": {"s": upd_s, "tokens": tokens, "tokens_per_s": tokens / upd_s},
                       "update_weights": {"s": 0.4}, "reward": {"s": 0.1}},
            "memory_gb": {"max_allocated": 40.0}}


def test_scaling_efficiency_is_n_gpu_throughput_over_n_times_one_gpu(tmp_path):
    base = _gpu_step_line(1, 1, 16, gen_s=4.0, lp_s=0.6, upd_s=1.2, step_s=6.5, tokens=40_000, generated=31_000)
    # twice the prompts on two GPUs: the same step time would be perfect scaling
    tp1 = _gpu_step_line(2, 1, 32, gen_s=4.0, lp_s=0.75, upd_s=1.2, step_s=6.5, tokens=80_000, generated=62_000)
    tp2 = _gpu_step_line(2, 2, 32, gen_s=5.0, lp_s=0.6, upd_s=1.5, step_s=8.125, tokens=80_000, generated=62_000)
    stale = _gpu_step_line(2, 1, 32, gen_s=9.0, lp_s=9.0, upd_s=9.0, step_s=30.0, tokens=80_000, generated=62_000)
    other = _gpu_step_line(2, 1, 32, gen_s=4.0, lp_s=0.6, upd_s=1.2, step_s=6.5, tokens=80_000, generated=62_000,
                           shape="qwen3-4b")  # no one-GPU line of its own model
    results = tmp_path / "results.jsonl"
    results.write_text("\n".join(json.dumps(x) for x in [stale, base, {"bench": "verl_learn"}, tp1, tp2, other])
                       + "\nnot json\n")
    out = scaling.summarize(scaling.read_lines(results))
    by = {(r["shape"], r["tp"]): r for r in out}
    one = by[("qwen3-0.6b", 1)]
    assert one["replicas"] == 2 and one["batch"] == 32 and one["baseline_batch"] == 16
    assert one["phases"]["generate"]["efficiency"] == 1.0 and one["phases"]["old_log_prob"]["efficiency"] == 0.8
    assert one["efficiency"] == 1.0 and one["target_met"]  # the later line replaced the stale measurement
    assert one["phases"]["update_weights"] == {"s_1gpu": 0.4, "s": 0.4}
    two = by[("qwen3-0.6b", 2)]
    assert two["replicas"] == 1 and two["efficiency"] == 0.8 and two["target_met"]
    assert two["phases"]["update"]["efficiency"] == 0.8
    assert "error" in by[("qwen3-4b", 1)]
    # the command line: one JSON line per measurement, the table on stderr, exit 1 while a baseline is missing
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "scaling.py"), str(results)],
                         capture_output=True, text=True, cwd=ROOT)
    assert run.returncode == 1 and len(run.stdout.splitlines()) == 3
    assert "| generate | 4.00 | 7,750 | 4.00 | 15,500 | 1.00 |" in run.stderr


def test_gpu_step_takes_gpus_and_tensor_parallel():
    args = gpu_step_args(["--shape", "qwen3-0.6b", "--gpus", "2", "--tp", "2", "--batch", "32"])
    assert args.no_ceilings  # the ceilings are one-GPU measurements
    overrides = verl_overrides(args, Path("/m"), Path("/r"))
    assert "trainer.n_gpus_per_node=2" in overrides and "data.train_batch_size=32" in overrides
    assert "actor_rollout_ref.rollout.tensor_model_parallel_size=2" in overrides
    assert not gpu_step_args(["--gpus", "1"]).no_ceilings
    with pytest.raises(SystemExit):
        gpu_step_args(["--gpus", "3", "--tp", "2"])


def test_two_gpu_checks_refuse_a_resume_check_with_nothing_to_resume():
    with pytest.raises(SystemExit):
        two_gpu_checks.parse_args(["--kill-after-checkpoint", "--steps", "2", "--save-every", "2"])
    args = two_gpu_checks.parse_args(["--kill-after-checkpoint"])
    overrides = two_gpu_checks.job_overrides(args, "/m", Path("/r"), Path("/t.yaml"))
    assert "trainer.n_gpus_per_node=2" in overrides and "trainer.save_every=2" in overrides
    assert "actor_rollout_ref.rollout.enforce_eager=true" in overrides and "algorithm.advantage=arena" in overrides


def test_resume_check_wants_each_step_once_and_a_restart_after_the_checkpoint():
    lines = lambda steps: [{"step": 0, "val/accuracy": 0.0}] + [{"step": s, "timing/step_s": 1.0} for s in steps]  # noqa: E731
    good = two_gpu_checks.resume_check(lines([1, 2]), lines([1, 2, 3, 4]), 2, 4)
    assert good["ok"] and good["first_step_after_restart"] == 3 and good["steps_at_kill"] == [1, 2]
    fresh = two_gpu_checks.resume_check(lines([1, 2]), lines([1, 2, 1, 2, 3, 4]), 2, 4)  # started over
    assert not fresh["ok"] and fresh["duplicates"] == [1, 2]
    lost = two_gpu_checks.resume_check(lines([1]), lines([1, 3, 4]), 2, 4)  # step 2 never logged
    assert not lost["ok"] and lost["missing"] == [2]
    assert not two_gpu_checks.resume_check(lines([1]), lines([1, 2]), None, 4)["ok"]  # never killed


def _rankings(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("step,group,prompt,rollout,matches,wins,losses,rank,score\n"
                    + "".join(f"{s},{g},0,{r},{m},1,1,1,0.5\n" for s, g, r, m in rows))


def test_arena_check_finds_split_missing_and_incomplete_groups(tmp_path):
    full = lambda step, group: [(step, group, r, 2) for r in range(3)]  # noqa: E731
    _rankings(tmp_path / "arena" / "h-1" / "rankings.csv", full(1, "a") + full(1, "b") + full(2, "c"))
    _rankings(tmp_path / "arena" / "h-2" / "rankings.csv", full(2, "d"))
    ok = two_gpu_checks.arena_check(tmp_path, [1, 2], groups_per_step=2, n=3, topology="round_robin")
    assert ok["ok"] and ok["groups_per_step"] == {1: 2, 2: 2} and ok["workers_with_rankings"] == 2
    _rankings(tmp_path / "arena" / "h-2" / "rankings.csv", full(2, "d") + [(2, "c", 0, 2)] + [(3, "e", 0, 1)])
    bad = two_gpu_checks.arena_check(tmp_path, [1, 2], groups_per_step=2, n=3, topology="round_robin")
    assert not bad["ok"]
    text = " | ".join(bad["problems"])
    assert "group c: in 2 workers' files" in text and "rollouts [0, 0, 1, 2]" in text
    assert "steps that did not train: [3]" in text
    assert not two_gpu_checks.arena_check(tmp_path, [1, 2, 4], 2, 3, "round_robin")["ok"]  # step 4 unranked


def _run_checks(tmp_path, monkeypatch, capsys, *extra):
    monkeypatch.setattr(two_gpu_checks, "LEFTOVER_WAIT_S", 3)
    monkeypatch.setattr(two_gpu_checks, "GPU_FREE_WAIT_S", 1)
    code = two_gpu_checks.main(["--job-command", f"{sys.executable} {FAKE_JOB}", "--model", "/none", "--steps", "4",
                                "--save-every", "2", "--timeout", "120", "--out", str(tmp_path), *extra])
    return code, json.loads(capsys.readouterr().out.splitlines()[-1])


def test_kill_after_the_first_checkpoint_restart_and_nothing_left(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FAKE_WAIT_FOR_KILL", "1")
    code, result = _run_checks(tmp_path, monkeypatch, capsys, "--kill-after-checkpoint")
    assert code == 0 and result["ok"], json.dumps(result, indent=1)
    first, second = result["launches"]
    assert first["killed_after_checkpoint"] == 2 and first["exit_code"] == -signal.SIGKILL
    assert second["exit_code"] == 0 and result["resume"]["first_step_after_restart"] == 3
    for launch in result["servers"]["launches"]:  # one server per worker, each gone after its launch
        assert launch["parent_processes"] == 2 and launch["parent_names"] == ["ray::AgentLoopWorkerTQ"]
        assert launch["left_servers"] == [] and launch["left_session_processes"] == []
    assert result["arena"]["groups_per_step"] == {"1": 2, "2": 2, "3": 2, "4": 2}


def test_a_server_left_behind_is_reported(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FAKE_LEAK", "1")
    code, result = _run_checks(tmp_path, monkeypatch, capsys)
    left = result["servers"]["launches"][0]["left_servers"]
    try:
        assert code == 1 and not result["servers"]["ok"] and len(left) == 1
        assert result["finished"] and result["arena"]["ok"]
    finally:
        for pid in left:
            os.kill(pid, signal.SIGKILL)


def test_gpu_suite_parses_and_names_its_groups():
    assert subprocess.run(["bash", "-n", str(ROOT / "benchmarks" / "gpu_suite.sh")]).returncode == 0
    usage = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_suite.sh")], capture_output=True, text=True)
    assert usage.returncode == 2
    assert all(g in usage.stdout for g in ("two_gpu", "two_gpu_checks", "check"))
