"""benchmarks/vs_trl.py --shape: TRL trains the job gpu_step.py gives ours at the shape, never with more tokens a
micro-batch than ours' tuning plan gives verl's actor, and its steps sum up into the phases gpu_step.py names."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from benchmarks.gpu_step import parse_args
from benchmarks.trl_side import last_error, phase_medians
from benchmarks.vs_trl import TRL_SHAPE_SETTINGS, parameter_count, shape_job, vllm_sleep

ROOT = Path(__file__).resolve().parents[2]
SHAPES = ("qwen3-0.6b", "qwen3-4b")


@pytest.mark.parametrize("shape", SHAPES)
def test_trls_job_at_a_shape_is_gpu_steps_job_on_ours_defaults(shape):
    job, ours = shape_job(shape), parse_args(["--shape", shape])
    assert (job["prompts"], job["n"], job["steps"], job["lr"]) == (ours.batch, ours.n, ours.steps, ours.lr)
    assert (job["max_turns"], job["max_response_tokens"], job["max_total_tokens"]) == \
        (ours.max_turns, ours.max_response_tokens, ours.max_total_tokens)
    # what gpu_step.py leaves at configs/grpo.yaml's defaults, TRL gets as its settings (trl_side.py)
    cfg = yaml.safe_load((ROOT / "configs" / "grpo.yaml").read_text())
    assert job["temperature"] == cfg["rollout"]["temperature"] and cfg["rollout"]["top_p"] == 1.0
    assert job["warmup_steps"] == cfg["optim"]["warmup_steps"] and job["grad_clip"] == cfg["optim"]["grad_clip"]
    assert cfg["optim"]["weight_decay"] == 0 and cfg["algorithm"]["kl_coef"] == 0  # TRL: weight_decay 0, beta 0
    assert cfg["algorithm"]["clip_ratio_low"] == cfg["algorithm"]["clip_ratio_high"] == 0.2  # TRL: epsilon 0.2
    assert cfg["algorithm"]["loss_agg"] == "token_mean"  # TRL: loss_type dapo
    assert (job["prompts"] * job["n"]) % TRL_SHAPE_SETTINGS[shape]["micro_batch"] == 0


def test_the_dry_run_prints_the_job_and_trls_settings():
    done = subprocess.run([sys.executable, "benchmarks/vs_trl.py", "--shape", "qwen3-4b", "--device", "cuda", "--vllm",
                           "--models", "outputs/gpu_suite", "--dry-run"], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    line = yaml.safe_load(done.stdout)
    assert line["steps"] == 5 and line["job"]["max_total_tokens"] == 512 and line["model"] == "outputs/gpu_suite/model-qwen3-4b"
    settings = line["trl_settings"]
    assert {k: v for k, v in settings.items() if not k.startswith("vllm_") or k == "vllm_importance_sampling_correction"} \
        == {"micro_batch": 16, "gradient_checkpointing": True, "vllm_importance_sampling_correction": False, "save": False}
    assert isinstance(settings["vllm_enable_sleep_mode"], bool) and settings["vllm_sleep_why"]
    forced = subprocess.run([sys.executable, "benchmarks/vs_trl.py", "--shape", "qwen3-4b", "--device", "cuda", "--vllm",
                             "--models", "outputs/gpu_suite", "--dry-run", "--vllm-sleep", "on"],
                            cwd=ROOT, capture_output=True, text=True)
    assert yaml.safe_load(forced.stdout)["trl_settings"]["vllm_enable_sleep_mode"] is True


@pytest.mark.parametrize(("parameters", "device_gb", "sleeps"), [
    (4_022_468_096, 79.65, True),    # 4B on an H100 80GB: 60 GiB of training state + 24 GiB of vLLM
    (4_022_468_096, 139.8, False),   # 4B on an H200: fits without
    (441_117_696, 79.65, False),     # the 0.6B shape (its builtin vocabulary) anywhere
])
def test_trls_vllm_sleeps_only_where_its_training_state_and_vllm_would_not_fit(parameters, device_gb, sleeps):
    asleep, why = vllm_sleep("auto", parameters, 0.3, device_gb)
    assert asleep is sleeps and ("over" if sleeps else "within") in why
    assert vllm_sleep("auto", parameters, 0.3, None) == (False, "auto: no GPU memory read (nvidia-smi), so TRL's default")
    assert vllm_sleep("off", parameters, 0.3, device_gb)[0] is False and vllm_sleep("on", 1, 0.3, 500.0)[0] is True


def test_the_shapes_parameters_are_counted_from_their_config(tmp_path):
    from benchmarks.shapes import shape_config_dir

    assert parameter_count(shape_config_dir("qwen3-4b", tmp_path)) == 4_022_468_096  # Qwen3-4B's, tied embeddings


def test_a_trl_run_that_dies_before_its_first_step_is_a_record_of_why(tmp_path):
    log = "\n".join(["Loading...", "[rank0]: Traceback (most recent call last):",
                     "[rank0]:   File \"adam.py\", line 178, in _init_group",
                     "[rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 96.00 MiB.", ""])
    assert last_error(log) == "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 96.00 MiB."
    assert last_error("all fine\nValueError: bad\nmore") == "ValueError: bad" and last_error("no errors") is None


def test_trls_rollout_phase_leaves_out_the_weight_copy_and_the_old_log_prob_pass():
    steps = [{"step_s": s, "rollout_s": 3.0, "generate_s": 2.0, "weight_sync_s": 0.5, "old_log_prob_s": 0.25,
              "tools_s": 0.1, "reward_s": 0.05, "update_s": s - 3.0} for s in (5.0, 6.0, 7.0)]
    got = phase_medians(steps)
    assert got["rollout"] == 2.25 and got["update_weights"] == 0.5 and got["old_log_prob"] == 0.25
    assert got["step"] == 6.0 and got["update"] == 3.0 and got["generate"] == 2.0


@pytest.mark.slow  # composes verl's config per shape
@pytest.mark.parametrize("shape", SHAPES)
def test_trl_never_gets_more_tokens_a_micro_batch_than_ours_on_an_h200(tmp_path, monkeypatch, shape):
    pytest.importorskip("verl")
    from omegaconf import OmegaConf

    import rl_factory.backends.verl.config as verl_config
    from benchmarks.gpu_step import verl_overrides
    from benchmarks.shapes import shape_config_dir
    from rl_factory.backends.verl.config import compose_verl
    from rl_factory.backends.verl.launcher import absolute
    from rl_factory.config import load_config, parse, split_overrides

    monkeypatch.setattr(verl_config, "gpu_bytes", lambda: (143771 * 1024**2, True))
    args = parse_args(["--shape", shape, "--no-ceilings"])
    model = shape_config_dir(shape, tmp_path)
    ours, raw = split_overrides(verl_overrides(args, model, tmp_path / "run"))
    cfg = compose_verl(absolute(parse(load_config("grpo", ours))), raw,
                       {"train": "/d/train.parquet", "val": "/d/val.parquet"}, str(model))
    OmegaConf.resolve(cfg)
    trl = TRL_SHAPE_SETTINGS[shape]
    assert trl["gradient_checkpointing"] == cfg.actor_rollout_ref.model.enable_gradient_checkpointing
    assert trl["micro_batch"] * args.max_total_tokens <= cfg.actor_rollout_ref.actor.ppo_max_token_len_per_gpu


@pytest.mark.slow  # trains two TRL steps on a two-layer shape
def test_trl_at_the_smoke_shape_runs_two_steps_and_prints_its_line(tmp_path):
    pytest.importorskip("trl", reason="TRL's side needs .[bench] (or trl on PYTHONPATH, apart from verl)")
    import json
    import os

    env = dict(os.environ, BENCH_RESULTS_DIR=str(tmp_path / "records"), OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, "benchmarks/vs_trl.py", "--shape", "qwen3-smoke", "--steps", "2",
                           "--models", str(tmp_path), "--out", str(tmp_path / "run")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    line = json.loads(done.stdout.strip().splitlines()[-1])
    trl = line["trl"]
    assert line["shape"] == "qwen3-smoke" and line["job"]["max_response_tokens"] == 256
    assert len(trl["all_step_s"]) == 2 and trl["steps_timed"] == 1 and trl["median_s"] == trl["all_step_s"][1]
    assert set(trl["phases"]) == {"rollout", "generate", "tools", "reward", "old_log_prob", "update", "update_weights",
                                  "step"}
    assert 0 < trl["phases"]["generate"] <= trl["phases"]["rollout"] < trl["phases"]["step"]
    assert trl["mean_completion_tokens"] > 0 and "final_model" not in trl
    record = json.loads((tmp_path / "records" / "vs_trl.jsonl").read_text())
    assert "benchmarks/vs_trl.py --shape qwen3-smoke" in record["command"] and record["trl"] == trl


def test_trls_worker_dying_before_its_first_step_returns_a_record_not_an_exit(tmp_path):
    import argparse
    import os

    from benchmarks.trl_side import run_trl

    # a model directory that does not exist: the worker dies loading it (or importing trl, where it is absent)
    args = argparse.Namespace(steps=2, tool_latency_ms=0.0, seed=0, device="cpu", vllm=False, vllm_memory=0.3,
                              micro_batch=None, timeout=300)
    schema = {"type": "function", "function": {"name": "calculator", "parameters": {"type": "object"}}}
    got = run_trl(args, tmp_path / "trl", [schema], tmp_path / "no-model", dict(os.environ), shape_job("qwen3-smoke"))
    assert got["failed"] == "ended with 1 before its first step's end" and got["log"].endswith("worker.log")
    assert got["error"] and ("Error: " in got["error"] or "Exception: " in got["error"])
    assert "s_per_step" not in got and "final_model" not in got
