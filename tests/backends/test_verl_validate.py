"""verl's checks of its config before Ray starts (rl_factory/backends/verl/validate.py), as `--cfg job` (the
launcher's `train` with print_only) and `--doctor`'s config check run them: each bad config below would
pass composition and fail on the driver or minutes later in a verl worker; here each fails in about a
second with one line naming the key, and nothing is printed. In process, with the builtin model unbuilt
(only its name goes into verl's config): no model is built and no Ray started.
"""
from __future__ import annotations

import asyncio
import os

import pytest
import torch
import yaml

pytest.importorskip("verl", reason="verl is an extra: bash setup.sh --dev (verl-cpu)")

from rl_factory.backends.verl.launcher import train  # noqa: E402
from rl_factory.config import ConfigError, load_config, split_overrides  # noqa: E402
from rl_factory.doctor import Doctor  # noqa: E402
from rl_factory.doctor.checks import config as doctor_config  # noqa: E402
from rl_factory.doctor.registry import CheckFailed  # noqa: E402


def cfg_job(tmp_path, *overrides: str) -> None:
    """`bash main_grpo.sh trainer.backend=verl OVERRIDES --cfg job`, in process (it prints to stdout)."""
    ours, theirs = split_overrides(["trainer.backend=verl", f"trainer.output_dir={tmp_path / 'run'}", *overrides])
    train(load_config("grpo", ours), theirs, print_only="job")


def doctor_config_row(tmp_path, *overrides: str) -> str:
    """The detail of `--doctor`'s config row (CheckFailed when it fails)."""
    doc = Doctor(["trainer.backend=verl", f"trainer.output_dir={tmp_path / 'run'}", *overrides])
    return asyncio.run(doctor_config(doc))


BAD = [
    # a `+` key verl's RolloutConfig has no field for: composed, printed, and fatal in every AgentLoopWorker
    (["+actor_rollout_ref.rollout.gpu_memory_utilisation=0.5"],
     "unknown verl key actor_rollout_ref.rollout.gpu_memory_utilisation (did you mean "
     "actor_rollout_ref.rollout.gpu_memory_utilization?)"),
    # a `+` key under a node verl reads key by key, that no line of verl reads: silently ignored by verl
    (["+ray_kwargs.timeline_json_fil=t.json"],
     "unknown verl key ray_kwargs.timeline_json_fil (did you mean ray_kwargs.timeline_json_file?): verl never reads it"),
    # a `+` key under the node verl passes to ray.init: a parameter ray.init lacks
    (["+ray_kwargs.ray_init.num_cpu=4"],
     "unknown verl key ray_kwargs.ray_init.num_cpu (did you mean ray_kwargs.ray_init.num_cpus?): ray.init has no "
     "such parameter"),
    # verl's validate_config: sampled validation at temperature 0, from our own keys
    (["rollout.temperature=0", "rollout.val_temperature=0.5"],
     "verl rejects actor_rollout_ref.rollout.temperature (rollout.temperature)"),
    # verl's worker assertion at the first update: 6 prompts x 3 = 18 trajectories over 8 GPUs
    (["rollout.n=3", "data.train_batch_size=6"],
     "actor_rollout_ref.actor.ppo_mini_batch_size=6 x actor_rollout_ref.rollout.n=3 = 18 trajectories per update "
     "must split evenly over 8 data-parallel rank(s)"),
    # more GPUs per vLLM replica than the job has: verl would start no replica
    (["actor_rollout_ref.rollout.tensor_model_parallel_size=16"],
     "actor_rollout_ref.rollout.tensor_model_parallel_size=16: one vLLM replica takes 16 GPU(s), which must divide "
     "the 8 of trainer.n_gpus_per_node x trainer.nnodes"),
    # the actor worker's assertion at start-up: log-prob batching by tokens while the update batches by count
    (["actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=false"],
     "actor_rollout_ref.actor.use_dynamic_bsz=True but actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=False"),
    # a worker extension vLLM would fail to import in each worker it starts
    (["+actor_rollout_ref.rollout.engine_kwargs.vllm.worker_extension_cls=my_pkg.ext.MyExtension"],
     "actor_rollout_ref.rollout.engine_kwargs.vllm.worker_extension_cls=my_pkg.ext.MyExtension: no module "
     "'my_pkg.ext' on this machine"),
    # numbers verl passes on unchecked: vLLM refuses the share when its server starts; no epoch trains nothing
    (["actor_rollout_ref.rollout.gpu_memory_utilization=1.5"],
     "actor_rollout_ref.rollout.gpu_memory_utilization=1.5: must be a number in (0, 1]"),
    (["actor_rollout_ref.actor.ppo_epochs=0"], "actor_rollout_ref.actor.ppo_epochs=0: must be an integer >= 1"),
    # vLLM takes its KV cache in bytes as a whole number from verl's engine_kwargs ("16G" only on its command line)
    (["+actor_rollout_ref.rollout.engine_kwargs.vllm.kv_cache_memory_bytes=16G"],
     "actor_rollout_ref.rollout.engine_kwargs.vllm.kv_cache_memory_bytes='16G': must be null or an integer >= 1"),
    # a value verl's RolloutConfig refuses when a worker converts the slice
    (["actor_rollout_ref.rollout.mode=sync"],
     "verl rejects actor_rollout_ref.rollout: Rollout mode 'sync' has been removed"),
]


@pytest.mark.parametrize("overrides, line", BAD, ids=[b[0][0].split("=")[0] for b in BAD])
def test_cfg_job_and_the_doctor_name_the_key_verl_would_refuse(overrides, line, tmp_path, capsys):
    with pytest.raises(ConfigError) as refused:
        cfg_job(tmp_path, *overrides)
    assert str(refused.value).startswith(line) and "\n" not in str(refused.value)
    assert capsys.readouterr().out == ""  # nothing printed: the config is not one verl would run
    with pytest.raises(CheckFailed) as failed:
        doctor_config_row(tmp_path, *overrides)
    assert failed.value.detail.startswith(line)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("overrides", [
    [],
    ["algorithm.advantage=gae"],  # verl converts the critic too (its model, a name here, is left to the run)
    ["algorithm.kl_coef=0.01"],  # and the reference slice, rewritten as its worker does
    ["trainer.n_gpus_per_node=2", "actor_rollout_ref.rollout.tensor_model_parallel_size=2"],
    # keys verl reads that its YAML does not list: free-form nodes, a ray.init argument
    ["+actor_rollout_ref.model.override_config.rope_theta=10000", "+ray_kwargs.ray_init.address=auto",
     "+ray_kwargs.ray_init.include_dashboard=false",
     "+actor_rollout_ref.rollout.engine_kwargs.vllm.enable_chunked_prefill=true"],
], ids=["default", "gae", "reference", "tp2", "free-form"])
def test_a_valid_config_passes_both_and_cfg_job_prints_only_the_config(overrides, tmp_path, capsys):
    cfg_job(tmp_path, *overrides)
    printed = yaml.safe_load(capsys.readouterr().out)  # verl's "[validate_config] ... passed" is not on stdout
    assert printed["actor_rollout_ref"]["rollout"]["name"] == "vllm" and "rl_factory" in printed
    detail = doctor_config_row(tmp_path, *overrides)
    assert "backend verl; verl validated its config" in detail
    # this machine's GPUs are a warning, never a failure: the doctor may run where the job is submitted from
    wanted = next((int(o.split("=")[1]) for o in overrides if o.startswith("trainer.n_gpus_per_node=")), 8)
    short = not os.environ.get("RAY_ADDRESS") and torch.cuda.device_count() < wanted
    assert ("warning: a run started here would stop" in detail) == short
    assert not (tmp_path / "run").exists()
