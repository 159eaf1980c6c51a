"""benchmarks/async_training.py on CPU: its GPU arm's verl commands compose (k=1: verl's colocated async
trainer), and without a GPU that arm says it was skipped."""
import argparse
import json
import subprocess

import pytest
import yaml

from benchmarks import async_training, gpu_step
from tests.e2e.test_main_scripts import REPO, script_env


def args(*extra):
    return argparse.Namespace(steps=4, batch=4, n=2, overrides=list(extra), timeout=60, h200_models=["tiny"],
                              h200_staleness=[1, 0], shapes_dir=None)


@pytest.mark.slow  # composes through main_grpo.sh
@pytest.mark.parametrize("k, mode", [(0, "sync"), (1, "colocate_async")])
def test_the_h200_arm_composes_verls_colocated_job(tmp_path, tiny_model_dir, k, mode):
    pytest.importorskip("verl", reason="verl is an extra")
    overrides = gpu_step.verl_overrides(async_training.h200_job(args(), k, "tiny"), tiny_model_dir, tmp_path / "run")
    proc = subprocess.run(["bash", "main_grpo.sh", *overrides, "--cfg", "job"], cwd=REPO, env=script_env(),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    cfg = yaml.safe_load(proc.stdout)
    assert cfg["trainer"]["v1"]["trainer_mode"] == mode and cfg["trainer"]["n_gpus_per_node"] == 1
    if k:
        assert cfg["trainer"]["v1"]["sampler"]["max_off_policy_threshold"] == 2


@pytest.mark.parametrize("name, action", [("tiny", "stop"), ("qwen3-0.6b", "warn")])
def test_a_random_init_shape_keeps_training_on_its_constant_reward(tmp_path, name, action):
    # random-init weights score 0 on every trajectory: the guard's default `stop` would end the arm at step 5
    from pathlib import Path

    from rl_factory.config import load_config, split_overrides

    ours, _ = split_overrides(gpu_step.verl_overrides(async_training.h200_job(args(), 1, name), Path("/m"), tmp_path))
    assert load_config("grpo", ours).trainer.guard.reward_constant.action == action


def test_without_a_gpu_the_h200_arm_is_skipped(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is here")
    assert async_training.h200(args(), tmp_path) == {"skipped": "no CUDA device on this machine"}


def test_step_time_is_the_mean_of_an_alternating_series_and_the_speedup_uses_it():
    def lines(times):
        return [{"step": i + 1, "timing/step_s": t} for i, t in enumerate(times)]

    # k=1's steps alternate between a step whose batch was ready and one that waited for it
    alternating = async_training.step_times(lines([5.0, 1.2, 0.4, 1.2, 0.4, 1.2, 0.4, 1.2]))
    assert alternating == {"mean_step_s": 0.857, "median_step_s": 1.2}  # step 1 (start-up) left out
    on_policy = async_training.step_times(lines([5.0, 1.1, 1.1, 1.1]))

    def run(times, accuracy):
        return {**times, "val_accuracy": accuracy}

    arm = async_training.summarize({0: [run(on_policy, 0.98), run(on_policy, 0.99)],
                                    1: [run(alternating, 0.98), run(alternating, 0.97)]})
    assert arm["k1"]["speedup"] == round(1.1 / 0.857, 3) and arm["k1"]["median_step_s"] == 1.2
    assert arm["accuracy_spread_k0"] == 0.01 and arm["within_spread"] == {"k1": True}


def test_the_h200_arms_async_metrics_are_medians_of_the_steps_after_the_first():
    lines = [{"step": 1, "async/staleness/max": 9, "timing/step_s": 30.0},
             {"step": 2, "async/staleness/max": 1, "training/off_policy/trajectory_spans/mean": 1.5, "x": 3},
             {"step": 3, "async/staleness/max": 2, "training/off_policy/trajectory_spans/mean": 1.0,
              "timing/trainer_idle_s": 0.25},
             {"step": 4, "async/staleness/max": 1, "async/note": "text"}]
    assert async_training.async_medians(lines) == {
        "async/staleness/max": 1, "training/off_policy/trajectory_spans/mean": 1.25, "timing/trainer_idle_s": 0.25}
    assert async_training.async_medians([{"step": 1, "timing/step_s": 1.0}]) == {}


def test_a_launch_that_stopped_early_says_why(tmp_path):
    from benchmarks.stamp import ENDED_FILE, how_it_ended

    assert how_it_ended(tmp_path) == {"exit_code": None, "guard_bundles": [], "log_lines": []}
    (tmp_path / ENDED_FILE).write_text('{"exit_code": 3}\n')
    (tmp_path / "guard" / "step_000002_receipts").mkdir(parents=True)
    (tmp_path / "bench_stdout.log").write_text(
        "+  1.0s starting\n+ 90.0s guard: receipts at step 2: 1 of 128 trajectories ... [stop; bundle x]\n+ 90.1s done\n")
    ended = how_it_ended(tmp_path)
    assert ended["exit_code"] == 3 and ended["guard_bundles"] == ["step_000002_receipts"]
    assert ended["log_lines"] == ["+ 90.0s guard: receipts at step 2: 1 of 128 trajectories ... [stop; bundle x]"]


def test_launches_of_an_earlier_call_on_the_same_gpu_join_the_record(tmp_path):
    results = tmp_path / "async_training.jsonl"
    other_gpu = {"benchmark": "async_training", "date": "d0", "commit": "c0", "command": "x",
                 "h200": {"gpu": "NVIDIA H100 80GB HBM3", "tiny": {"k0": {"mean_step_s": 9.0}}}}
    same_gpu = {"benchmark": "async_training", "date": "d1", "commit": "c1", "command": "async k=1",
                "h200": {"gpu": "NVIDIA H200", "tiny": {"k1": {"mean_step_s": 1.0}}}}
    results.write_text("\n".join(json.dumps(x) for x in (same_gpu, other_gpu)) + "\n")
    runs = {"k0": {"mean_step_s": 2.0}}
    async_training.join_earlier(runs, "tiny", "NVIDIA H200", results)
    # this call's k0 stays; k1 comes from the H200 line, not from the later H100 one, and says where it came from
    assert runs["k0"] == {"mean_step_s": 2.0}
    assert runs["k1"] == {"mean_step_s": 1.0,
                          "earlier_invocation": {"date": "d1", "commit": "c1", "command": "async k=1"}}
    nothing = {"k0": {"mean_step_s": 2.0}}
    async_training.join_earlier(nothing, "qwen3-0.6b", "NVIDIA H200", results)
    assert nothing == {"k0": {"mean_step_s": 2.0}}


def test_gpu_suite_passes_one_launchs_options_before_the_fast_settings(tmp_path):
    """`gpu_suite.sh async tiny --h200-staleness 1`: the option takes several values, and the start-up settings
    that follow are overrides, not more of its values."""
    env = {**script_env(), "RESULTS": str(tmp_path / "results.jsonl")}
    done = subprocess.run(["bash", "benchmarks/gpu_suite.sh", "async", "tiny", "--h200-staleness", "1", "--dry-run"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    parsed = json.loads(next(x for x in done.stdout.splitlines() if x.startswith("{")))
    assert parsed["h200_staleness"] == [1] and parsed["h200_models"] == ["tiny"]
    assert "actor_rollout_ref.rollout.free_cache_engine=false" in parsed["overrides"]
    assert parsed["overrides"][-1] == "actor_rollout_ref.rollout.enforce_eager=true"
