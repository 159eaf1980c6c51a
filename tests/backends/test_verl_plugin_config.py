"""The verl plugin and the composed verl config, against the real verl package (CPU only).

- A fresh Python process that only imports verl finds our estimators and loss in verl's registries
  (that is what every Ray worker does), and they compute what ours compute.
- `main_grpo.sh trainer.backend=verl --cfg job` prints the composed config without starting Ray, and
  that config passes verl's own `validate_config` and its dataclass conversions.
- Our keys map onto verl's; raw verl keys pass through and win; misspelled keys are named.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

pytestmark = pytest.mark.slow  # main_grpo.sh with the verl backend

pytest.importorskip("verl", reason="verl is an extra: bash setup.sh --dev (verl-cpu)")

from omegaconf import OmegaConf  # noqa: E402

from rl_factory.algorithms.advantages import compute_advantages  # noqa: E402
from rl_factory.algorithms.losses import ppo_clip_loss  # noqa: E402
from rl_factory.backends.verl.config import compose_verl  # noqa: E402
from rl_factory.backends.verl.launcher import absolute  # noqa: E402
from rl_factory.config import ConfigError, load_config, parse  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
PYTHON = sys.executable


def test_a_fresh_process_importing_verl_sees_our_estimators_and_loss():
    probe = r"""
import json, torch, verl
from verl.trainer.ppo import core_algos as c
from verl.workers.config import ActorConfig
rewards = torch.tensor([1.0, 0.0, 0.5, 2.0, 2.0, 1.0])
mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 1, 1], [1, 1, 0], [1, 1, 1]], dtype=torch.float32)
token_rewards = torch.zeros(6, 3)
last = mask.sum(-1).long() - 1
token_rewards[torch.arange(6), last] = rewards
index = ["a", "a", "a", "b", "b", "b"]
out = {"estimators": sorted(k for k in c.ADV_ESTIMATOR_REGISTRY if k in
       ("arena", "dr_grpo", "reinforce_pp", "rl_factory_grpo", "rl_factory_rloo")),
       "losses": [k for k in c.POLICY_LOSS_REGISTRY if k == "ppo_clip"]}
for name in ("arena", "dr_grpo", "rl_factory_grpo"):
    adv, ret = c.get_adv_estimator_fn(name)(token_level_rewards=token_rewards, response_mask=mask, index=index)
    out[name] = adv.tolist()
torch.manual_seed(0)
old, new = torch.randn(6, 3), torch.randn(6, 3)
adv = torch.randn(6)
cfg = ActorConfig(strategy="fsdp", rollout_n=1, clip_ratio_low=0.2, clip_ratio_high=0.28, ppo_micro_batch_size_per_gpu=1)
loss, metrics = c.get_policy_loss_fn("ppo_clip")(old, new, adv[:, None] * mask, mask, "token-mean", cfg)
out["loss"], out["clipfrac"] = loss.item(), metrics["actor/pg_clipfrac"]
print(json.dumps(out))
"""
    env = {k: v for k, v in os.environ.items() if k != "VERL_USE_EXTERNAL_PLUGINS"}
    run = subprocess.run([PYTHON, "-c", probe], capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["estimators"] == ["arena", "dr_grpo", "reinforce_pp", "rl_factory_grpo", "rl_factory_rloo"]
    assert out["losses"] == ["ppo_clip"]

    rewards, groups = [1.0, 0.0, 0.5, 2.0, 2.0, 1.0], [0, 0, 0, 1, 1, 1]
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 1, 1], [1, 1, 0], [1, 1, 1]], dtype=torch.float32)
    for name, ours in [("arena", compute_advantages("arena", rewards, groups, scores=rewards)),
                       ("dr_grpo", compute_advantages("dr_grpo", rewards, groups)),
                       ("rl_factory_grpo", compute_advantages("grpo", rewards, groups))]:
        # verl's call gives per-token advantages: ours broadcast over each response's tokens
        assert torch.allclose(torch.tensor(out[name]), ours[:, None] * mask, atol=1e-6), name

    torch.manual_seed(0)
    old, new, adv = torch.randn(6, 3), torch.randn(6, 3), torch.randn(6)
    ours, metrics = ppo_clip_loss(new, old, adv[:, None] * mask, mask, clip_ratio_low=0.2, clip_ratio_high=0.28)
    assert out["loss"] == pytest.approx(ours.item(), abs=1e-6)
    assert out["clipfrac"] == pytest.approx(metrics["clipfrac"], abs=1e-6)


def test_disabling_plugins_leaves_verl_without_our_names():
    """The registration above really comes from the entry point (verl's own switch turns it off)."""
    probe = "import verl; from verl.trainer.ppo import core_algos as c; print('arena' in c.ADV_ESTIMATOR_REGISTRY)"
    run = subprocess.run([PYTHON, "-c", probe], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "VERL_USE_EXTERNAL_PLUGINS": "none"})
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip().splitlines()[-1] == "False"


def test_cfg_job_prints_the_composed_config_without_starting_ray(tmp_path):
    run = subprocess.run(["bash", "main_grpo.sh", "trainer.backend=verl", "rollout.n=4",
                          "trainer.n_gpus_per_node=2", "algorithm.advantage=arena",
                          f"trainer.output_dir={tmp_path / 'run'}", "--cfg", "job"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHON": PYTHON})
    assert run.returncode == 0, run.stderr[-2000:]
    cfg = yaml.safe_load(run.stdout)
    assert cfg["actor_rollout_ref"]["rollout"]["n"] == 4
    assert cfg["trainer"]["n_gpus_per_node"] == 2
    assert cfg["algorithm"]["adv_estimator"] == "arena"
    assert cfg["actor_rollout_ref"]["rollout"]["agent"]["default_agent_loop"] == "rl_factory"
    assert Path(cfg["actor_rollout_ref"]["rollout"]["agent"]["agent_loop_config_path"]).is_file()
    assert cfg["reward"]["custom_reward_function"]["path"] == "pkg://rl_factory.backends.verl.reward"
    assert cfg["rl_factory"]["rollout"]["n"] == 4 and cfg["rl_factory"]["env"]["tools"].endswith("calculator.yaml")
    assert "ray init" not in run.stdout + run.stderr and not (tmp_path / "run").exists()  # nothing started or written


def compose(tmp_path, tiny_model_dir, overrides=(), raw=()):
    ours = absolute(parse(load_config("grpo", ["trainer.backend=verl", f"trainer.output_dir={tmp_path}", *overrides])))
    return compose_verl(ours, list(raw), {"train": "/data/train.parquet", "val": "/data/val.parquet"},
                        str(tiny_model_dir) + "/")


@pytest.mark.parametrize("advantage", ["grpo", "arena", "gae", "reinforce_pp"])
def test_composed_config_passes_verls_own_validation(tmp_path, tiny_model_dir, advantage):
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import omega_conf_to_dataclass, validate_config

    cfg = compose(tmp_path, tiny_model_dir, [f"algorithm.advantage={advantage}", "algorithm.kl_coef=0.01"])
    OmegaConf.resolve(cfg)
    validate_config(cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))
    assert need_critic(cfg) == (advantage == "gae") and need_reference_policy(cfg)  # kl_coef > 0: a reference model
    rollout = omega_conf_to_dataclass(cfg.actor_rollout_ref.rollout)
    assert rollout.n == 8 and rollout.agent.default_agent_loop == "rl_factory"
    assert rollout.response_length == cfg.rl_factory.rollout.max_total_tokens
    actor = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
    assert actor.policy_loss.loss_mode == "ppo_clip" and actor.optim.lr == cfg.rl_factory.optim.lr
    assert actor.kl_loss_coef == 0.01 and actor.use_kl_loss
    assert omega_conf_to_dataclass(cfg.algorithm).adv_estimator == advantage
    assert omega_conf_to_dataclass(cfg.critic).optim.lr == cfg.rl_factory.algorithm.critic.lr
    assert not cfg.actor_rollout_ref.model.path.endswith("/")  # verl asserts on a trailing slash
    assert cfg.trainer.default_local_dir == str(tmp_path / "checkpoints")


def test_raw_verl_keys_win_over_the_mapping_and_typos_are_named(tmp_path, tiny_model_dir):
    cfg = compose(tmp_path, tiny_model_dir, ["rollout.n=16"], raw=["actor_rollout_ref.rollout.n=4"])
    assert cfg.actor_rollout_ref.rollout.n == 4 and cfg.rl_factory.rollout.n == 16
    with pytest.raises(ConfigError, match=r"tensor_model_parallel_size\?"):
        compose(tmp_path, tiny_model_dir, raw=["actor_rollout_ref.rollout.tensor_model_paralel_size=2"])
    # extra estimator options travel to every Ray worker in the runtime env
    cfg = compose(tmp_path, tiny_model_dir, ["algorithm.advantage=reinforce_pp", "+algorithm.advantage_options.epsilon=0.001"])
    env_vars = cfg.ray_kwargs.ray_init.runtime_env.env_vars
    assert json.loads(env_vars.RL_FACTORY_ADVANTAGE_OPTIONS) == {"epsilon": 0.001}
    # jsonl is our metrics.jsonl contract (run_dir.RunDirLogger), not verl's file logger
    assert list(cfg.trainer.logger) == ["console", "rl_factory"] and "VERL_FILE_LOGGER_PATH" not in env_vars


def test_tuned_settings_follow_the_model_and_lose_to_raw_keys(tmp_path, tiny_model_dir):
    cfg = compose(tmp_path, tiny_model_dir, [])
    model, actor = cfg.actor_rollout_ref.model, cfg.actor_rollout_ref.actor
    # no flash-attn here: our varlen attention, registered in each worker through verl's external_lib
    assert model.override_config.attn_implementation == "rl_factory_varlen"
    assert "rl_factory.models.varlen_attention" in list(model.external_lib)
    assert model.use_remove_padding and model.use_fused_kernels and actor.use_dynamic_bsz
    # a tiny model leaves room for a full micro-batch without gradient checkpointing
    assert model.enable_gradient_checkpointing is False and actor.ppo_max_token_len_per_gpu == 32768
    assert cfg.data.dataloader_num_workers == 0
    assert cfg.transfer_queue.backend.SimpleStorage.num_data_storage_units == 2  # one node
    cfg = compose(tmp_path, tiny_model_dir, [], raw=["actor_rollout_ref.model.enable_gradient_checkpointing=true",
                                                     "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=4096",
                                                     "transfer_queue.backend.SimpleStorage.num_data_storage_units=8"])
    assert cfg.actor_rollout_ref.model.enable_gradient_checkpointing is True
    assert cfg.actor_rollout_ref.actor.ppo_max_token_len_per_gpu == 4096
    assert cfg.transfer_queue.backend.SimpleStorage.num_data_storage_units == 8


def test_adamw_is_fused_only_where_verl_builds_torchs(tmp_path, tiny_model_dir):
    optim = compose(tmp_path, tiny_model_dir, []).actor_rollout_ref.actor.optim
    assert (optim.optimizer_impl, optim.optimizer) == ("torch.optim", "AdamW")
    assert OmegaConf.to_container(optim.override_optimizer_config) == {"fused": True}
    # another library's optimizer takes no `fused` argument: left as configured
    eight_bit = ["actor_rollout_ref.actor.optim.optimizer_impl=bitsandbytes.optim",
                 "actor_rollout_ref.actor.optim.optimizer=AdamW8bit"]
    assert compose(tmp_path, tiny_model_dir, [], raw=eight_bit).actor_rollout_ref.actor.optim.override_optimizer_config \
        is None
    # options given for torch's own win whole: the plan adds nothing inside them
    given = ["+actor_rollout_ref.actor.optim.override_optimizer_config.foreach=true"]
    got = compose(tmp_path, tiny_model_dir, [], raw=given).actor_rollout_ref.actor.optim.override_optimizer_config
    assert OmegaConf.to_container(got) == {"foreach": True}


@pytest.mark.parametrize("args, message", [
    (["trainer.n_gpus_per_nod=8"], "did you mean trainer.n_gpus_per_node"),
    (["algorithm.advantage=arena", "algorithm.arena.anchor=greedy"],
     "error: algorithm.arena.anchor=greedy is not supported on the verl backend with algorithm.advantage=arena"),
    (["rollout.context=step", "algorithm.advantage=rloo"],
     "error: rollout.context=step is not supported on the verl backend with algorithm.advantage=rloo"),
    (["algorithm.advantage=arena", "trainer.use_v1=false"],
     "error: algorithm.advantage=arena is not supported on the verl backend with trainer.use_v1=false"),
    (["algorithm.advantage=gae", "algorithm.critic.vf_coef=0.25"],
     "error: algorithm.critic.vf_coef=0.25 is not supported on the verl backend with algorithm.advantage=gae"),
    (["worker_fetch=some"], "worker_fetch='some': expected one of needed, all"),
    (["sampling_logprobs_every=0"], "sampling_logprobs_every=0: expected an integer >= 1"),
    # verl's own checks before printing (validate.py; the cases: tests/backends/test_verl_validate.py)
    (["+actor_rollout_ref.rollout.gpu_memory_utilisation=0.5"],
     "error: unknown verl key actor_rollout_ref.rollout.gpu_memory_utilisation (did you mean "
     "actor_rollout_ref.rollout.gpu_memory_utilization?)"),
])
def test_bad_verl_configs_fail_with_one_line(args, message, tmp_path):
    run = subprocess.run(["bash", "main_grpo.sh", "trainer.backend=verl", *args, "--cfg", "job"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHON": PYTHON})
    assert run.returncode == 2, run.stderr[-2000:]
    assert message in run.stderr and "Traceback" not in run.stderr


def test_verl_keys_are_unknown_to_the_embedded_backend():
    run = subprocess.run(["bash", "main_grpo.sh", "trainer.n_gpus_per_node=8", "--cfg", "job"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHON": PYTHON})
    assert run.returncode == 2 and "unknown config key trainer.n_gpus_per_node" in run.stderr


def test_a_machine_without_gpus_is_told_so_instead_of_waiting(tmp_path, tiny_model_dir):
    """verl has no CPU platform: without RAY_ADDRESS the launcher checks the local GPUs before Ray starts."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    run = subprocess.run(["bash", "main_grpo.sh", "trainer.backend=verl", f"model.path={tiny_model_dir}",
                          f"trainer.output_dir={tmp_path}", "trainer.n_gpus_per_node=1"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300, env={**env, "PYTHON": PYTHON})
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    assert run.returncode == 2, run.stderr[-2000:]
    assert "this machine has 0 CUDA device(s)" in run.stderr
    # what ran before the check: our data in verl's layout, read back by the same loader as the embedded run
    import pyarrow.parquet as pq
    rows = pq.read_table(tmp_path / "verl_data" / "train.parquet").to_pylist()
    assert len(rows) == 2000 and rows[0]["rl_factory_split"] == "train" and rows[0]["prompt"][0]["role"] == "user"


def test_a_failed_registration_is_loud_and_stops_the_launcher():
    """verl swallows plugin errors at DEBUG level; ours says so at ERROR and the launcher refuses to start."""
    probe = r"""
import verl  # plugins disabled below: our module has not run
from verl.trainer.ppo import core_algos
core_algos.register_adv_est("arena")(lambda **kw: None)  # somebody else's "arena"
import rl_factory.backends.verl.plugin as plugin
from rl_factory.backends.verl.launcher import check_plugin
try:
    check_plugin("arena", "ppo_clip")
except Exception as exc:
    print("REFUSED", type(exc).__name__, str(exc).splitlines()[0])
"""
    run = subprocess.run([PYTHON, "-c", probe], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "VERL_USE_EXTERNAL_PLUGINS": "none"})
    assert run.returncode == 0, run.stderr[-2000:]
    assert "ERROR: registering with verl failed" in run.stderr
    assert "verl already has an advantage estimator named 'arena'" in run.stderr
    assert "REFUSED ConfigError rl_factory's verl plugin failed to register:" in run.stdout


def test_lora_syncs_merged_weights_unless_told_otherwise(tmp_path, tiny_model_dir):
    """vLLM's adapter path lost the adapter on the H200 (tests/backends/test_verl_lora_sync.py has why merging)."""
    cfg = compose(tmp_path, tiny_model_dir, ["model.lora_rank=8"])
    assert cfg.actor_rollout_ref.model.lora_rank == 8 and cfg.actor_rollout_ref.model.lora.merge is True
    raw = compose(tmp_path, tiny_model_dir, ["model.lora_rank=8"], raw=["actor_rollout_ref.model.lora.merge=false"])
    assert raw.actor_rollout_ref.model.lora.merge is False


@pytest.mark.parametrize("overrides, raw, mode", [
    ([], [], "update"),  # the default job: one epoch, one mini-batch
    (["optim.mini_batches=2"], [], "recompute"),
    (["optim.ppo_epochs=2"], [], "recompute"),
    ([], ["actor_rollout_ref.actor.ppo_epochs=2"], "recompute"),  # verl's own key, read after the mapping
    ([], ["trainer.use_v1=false"], "recompute"),
    ([], ["algorithm.rollout_correction.rollout_is=token"], "recompute"),
    (["algorithm.old_log_probs=rollout"], [], "rollout"),
    (["algorithm.old_log_probs=recompute"], [], "recompute"),
    ([], ["algorithm.rollout_correction.bypass_mode=true"], "rollout"),  # the user drives verl's switch
])
def test_old_log_probs_resolve_to_the_cheapest_exact_source(tmp_path, tiny_model_dir, overrides, raw, mode):
    cfg = compose(tmp_path, tiny_model_dir, overrides, raw)
    assert cfg.algorithm.rollout_correction.bypass_mode is (mode in ("update", "rollout"))
    assert (cfg.ray_kwargs.ray_init.runtime_env.env_vars.get("RL_FACTORY_OLD_LOG_PROBS") == "update") is (mode == "update")


@pytest.mark.parametrize("overrides, raw, message", [
    (["algorithm.old_log_probs=update", "optim.ppo_epochs=2"], [], "only for one optimizer step per batch"),
    (["algorithm.old_log_probs=update"], ["trainer.use_v1=false"], "with trainer.use_v1=false: verl's legacy trainer"),
    (["algorithm.old_log_probs=rollout"], ["algorithm.rollout_correction.rollout_is=token"],
     "with algorithm.rollout_correction=rollout_is"),
    (["algorithm.old_log_probs=update"], ["algorithm.rollout_correction.bypass_mode=false"],
     "with algorithm.rollout_correction.bypass_mode=false: .*; set only one of them"),
    # refused where the config is parsed, as on the embedded backend
    (["algorithm.old_log_probs=sometimes"], [], "algorithm.old_log_probs: Input should be 'auto', 'update', 'rollout' "
                                                "or 'recompute'"),
])
def test_an_old_log_probs_mode_that_would_be_inexact_is_refused(tmp_path, tiny_model_dir, overrides, raw, message):
    with pytest.raises(ConfigError, match=message):
        compose(tmp_path, tiny_model_dir, overrides, raw)


def test_update_mode_loss_uses_the_updates_own_log_probs_and_reports_vllms_distance():
    """In the actor workers (RL_FACTORY_OLD_LOG_PROBS=update, from Ray's runtime_env) our registered loss gets
    vLLM's log-probs as old_log_prob (verl's bypass mode) and trains against the update's own, detached: the
    loss and gradient are those of a recomputed old log-prob equal to the current one (ratio 1)."""
    probe = r"""
import json, sys, torch, verl
from verl.trainer.ppo import core_algos as c
from verl.workers.config import ActorConfig
torch.manual_seed(0)
mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 1, 1]], dtype=torch.float32)
rollout = torch.randn(4, 3) - 1.0
new = (rollout + 0.5 * torch.randn(4, 3)).requires_grad_()  # far enough from vLLM's that PPO would clip
adv = torch.randn(4)[:, None] * mask
cfg = ActorConfig(strategy="fsdp", rollout_n=1, clip_ratio_low=0.2, clip_ratio_high=0.2, ppo_micro_batch_size_per_gpu=1)
old = {"exact": new.detach().clone(), "rollout": rollout}.get(sys.argv[1])
if sys.argv[1] == "absent":  # rows 0 and 2 sampled without vLLM's log-probs (sampling_logprobs.py)
    old = rollout.clone()
    old[[0, 2]] = 1.0
loss, metrics = c.get_policy_loss_fn("ppo_clip")(old, new, adv, mask, "token-mean", cfg)
loss.backward()
print(json.dumps({"loss": loss.item(), "grad": new.grad.tolist(), "metrics": metrics,
                  "new": new.detach().tolist(), "rollout": rollout.tolist(), "mask": mask.tolist(),
                  "diff": ((new.detach().exp() - rollout.exp()).abs() * mask).sum().item() / mask.sum().item()}))
"""
    def run(arg, **env):
        base = {k: v for k, v in os.environ.items() if k not in ("VERL_USE_EXTERNAL_PLUGINS", "RL_FACTORY_OLD_LOG_PROBS")}
        out = subprocess.run([PYTHON, "-c", probe, arg], capture_output=True, text=True, env={**base, **env}, timeout=300)
        assert out.returncode == 0, out.stderr[-2000:]
        return json.loads(out.stdout.strip().splitlines()[-1])

    update = run("rollout", RL_FACTORY_OLD_LOG_PROBS="update")  # as in the workers: vLLM's log-probs arrive
    exact = run("exact")  # recompute with old == the current policy's log-probs
    rollout = run("rollout")  # rollout mode: vLLM's log-probs are the old ones
    assert update["loss"] == pytest.approx(exact["loss"], abs=1e-7)
    assert torch.allclose(torch.tensor(update["grad"]), torch.tensor(exact["grad"]), atol=1e-7)
    assert update["metrics"]["actor/ratio_mean"] == 1.0 and update["metrics"]["actor/ppo_kl"] == 0.0
    assert update["metrics"]["actor/pg_clipfrac"] == 0.0 and rollout["metrics"]["actor/pg_clipfrac"] > 0
    assert not torch.allclose(torch.tensor(rollout["grad"]), torch.tensor(exact["grad"]), atol=1e-4)
    assert update["metrics"]["actor/rollout_probs_diff_mean"] == pytest.approx(update["diff"], rel=1e-5)
    assert "actor/rollout_probs_diff_mean" not in exact["metrics"]
    # rows generated without vLLM's log-probs: the same loss, the distance over the rows that have them
    absent = run("absent", RL_FACTORY_OLD_LOG_PROBS="update")
    assert absent["loss"] == pytest.approx(exact["loss"], abs=1e-7)
    rows = torch.tensor(absent["mask"])
    rows[[0, 2]] = 0
    distance = (torch.tensor(absent["new"]).exp() - torch.tensor(absent["rollout"]).exp()).abs()
    expected = (distance * rows).sum() / rows.sum()
    assert absent["metrics"]["actor/rollout_probs_diff_mean"] == pytest.approx(expected.item(), rel=1e-5)


@pytest.mark.parametrize("overrides, raw, every", [
    ([], [], 10),  # old_log_probs=update: only the health checks read them
    ([], ["sampling_logprobs_every=3"], 3),
    (["optim.mini_batches=2"], [], 1),  # recompute
    (["algorithm.old_log_probs=rollout"], ["sampling_logprobs_every=3"], 1),
    ([], ["algorithm.rollout_correction.rollout_is=token"], 1),
    ([], ["algorithm.use_kl_in_reward=true"], 1),
])
def test_sampling_logprobs_are_asked_for_every_step_where_something_trains_on_them(tmp_path, tiny_model_dir,
                                                                                 overrides, raw, every):
    assert compose(tmp_path, tiny_model_dir, overrides, raw).sampling_logprobs_every == every


def test_vllm_workers_get_the_receipts_extension_unless_the_guard_or_the_user_says_otherwise(tmp_path, tiny_model_dir):
    """Our worker extension replaces verl's colocated one (it is verl's plus the sync receipts); a user's own wins."""
    key = "RL_FACTORY_ENGINE_SYNCS"
    cfg = compose(tmp_path, tiny_model_dir, [])
    assert (cfg.actor_rollout_ref.rollout.engine_kwargs.vllm.worker_extension_cls
            == "rl_factory.backends.verl.vllm_receipts.ReceiptsWorkerExtension")
    assert cfg.ray_kwargs.ray_init.runtime_env.env_vars[key].endswith("/engine_syncs")
    off = compose(tmp_path, tiny_model_dir, ["trainer.guard.receipts.action=off"])
    assert "worker_extension_cls" not in (off.actor_rollout_ref.rollout.engine_kwargs.vllm or {})
    assert key not in off.ray_kwargs.ray_init.runtime_env.env_vars
    mine = compose(tmp_path, tiny_model_dir, [],
                   raw=["+actor_rollout_ref.rollout.engine_kwargs.vllm.worker_extension_cls=my.Ext"])
    assert mine.actor_rollout_ref.rollout.engine_kwargs.vllm.worker_extension_cls == "my.Ext"


def test_ray_env_vars_reach_the_workers_as_the_text_they_were_written_as(tmp_path, tiny_model_dir):
    """Ray's runtime env takes text only; Hydra reads `=1` as a number and `=true` as a boolean."""
    key = "+ray_kwargs.ray_init.runtime_env.env_vars"
    cfg = compose(tmp_path, tiny_model_dir, raw=[f"{key}.VLLM_GC_DEBUG=1", f"{key}.SOME_FLAG=true",
                                                 f"{key}.SCALE=0.5", f"{key}.DROPPED=null", f"{key}.NAME=x"])
    env = OmegaConf.to_container(cfg.ray_kwargs.ray_init.runtime_env.env_vars)
    assert {k: env[k] for k in ("VLLM_GC_DEBUG", "SOME_FLAG", "SCALE", "NAME")} == {
        "VLLM_GC_DEBUG": "1", "SOME_FLAG": "true", "SCALE": "0.5", "NAME": "x"}
    assert "DROPPED" not in env and all(isinstance(v, str) for v in env.values())
    with pytest.raises(ConfigError, match=r"env_vars\.PATHS: an environment variable's value is text, not \['a'\]"):
        compose(tmp_path, tiny_model_dir, raw=[f"{key}.PATHS=[a]"])
