"""trainer.max_staleness and algorithm.correction on verl (CPU: the composed config, verl's own validation and
its own rollout-correction weights; the H200 run is in benchmarks/async_training.py)."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("verl", reason="verl is an extra: bash setup.sh --dev (verl-cpu)")

from omegaconf import OmegaConf  # noqa: E402

from rl_factory.backends.verl import supported  # noqa: E402
from rl_factory.algorithms.correction import CorrectionConfig, correct_advantages  # noqa: E402
from rl_factory.config import ConfigError  # noqa: E402
from tests.backends.test_verl_plugin_config import compose  # noqa: E402


def test_staleness_maps_onto_verls_colocated_async_trainer_and_passes_its_validation(tmp_path, tiny_model_dir):
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    cfg = compose(tmp_path, tiny_model_dir, ["trainer.max_staleness=2"])
    v1 = cfg.trainer.v1
    assert v1.trainer_mode == "colocate_async" and v1.colocate_async.num_warmup_batches == 2
    # verl counts the versions a trajectory spans (staleness + 1); wait = dropless, every prompt trains once
    assert v1.sampler.max_off_policy_threshold == 3 and v1.sampler.max_off_policy_strategy == "wait"
    # samples from older policies: the PPO ratio against vLLM's sampling log-probs (verl's bypass mode)
    assert cfg.algorithm.rollout_correction.bypass_mode is True
    assert cfg.ray_kwargs.ray_init.runtime_env.env_vars.RL_FACTORY_OLD_LOG_PROBS == "rollout"
    OmegaConf.resolve(cfg)
    validate_config(cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))


def test_on_policy_maps_to_exactly_the_config_without_the_key(tmp_path, tiny_model_dir):
    plain = compose(tmp_path, tiny_model_dir)
    zero = compose(tmp_path, tiny_model_dir, ["trainer.max_staleness=0", "trainer.partial_rollouts=false"])
    plain_values, zero_values = (OmegaConf.to_container(c) for c in (plain, zero))
    for values in (plain_values, zero_values):
        values.pop("rl_factory")
    assert zero_values == plain_values
    assert plain.trainer.v1.trainer_mode == "sync"


def test_the_two_gpu_disaggregated_command_composes_and_syncs_once_per_step(tmp_path, tiny_model_dir):
    """The command of docs/guides/async-training.md (one GPU trains, one serves vLLM), composed on CPU."""
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    cfg = compose(tmp_path, tiny_model_dir, ["trainer.max_staleness=1", "optim.mini_batches=2"],
                  ["trainer.n_gpus_per_node=1", "trainer.v1.trainer_mode=separate_async",
                   "actor_rollout_ref.rollout.nnodes=1", "actor_rollout_ref.rollout.n_gpus_per_node=1",
                   "actor_rollout_ref.rollout.checkpoint_engine.backend=nccl"])
    OmegaConf.resolve(cfg)
    validate_config(cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))
    assert cfg.actor_rollout_ref.rollout.n_gpus_per_node == 1 and cfg.trainer.n_gpus_per_node == 1
    v1 = cfg.trainer.v1
    assert v1.trainer_mode == "separate_async" and v1.separate_async.num_warmup_batches == 1
    # verl asserts train_batch_size == parameter_sync_step * ppo_mini_batch_size
    assert v1.separate_async.parameter_sync_step * cfg.actor_rollout_ref.actor.ppo_mini_batch_size == \
        cfg.data.train_batch_size


@pytest.mark.parametrize("kind, level", [("tis", "token"), ("tis", "sequence"), ("mis", "token"), ("mis", "sequence")])
def test_correction_maps_onto_verls_rollout_correction_with_the_same_weights(tmp_path, tiny_model_dir, kind, level):
    from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_weights

    cfg = compose(tmp_path, tiny_model_dir, [f"algorithm.correction.type={kind}", f"algorithm.correction.level={level}",
                                             "algorithm.correction.threshold=2.0", "trainer.max_staleness=1"])
    corr = cfg.algorithm.rollout_correction
    assert corr.rollout_is == level and corr.bypass_mode is False  # decoupled: verl recomputes pi_old
    assert cfg.ray_kwargs.ray_init.runtime_env.env_vars.RL_FACTORY_OLD_LOG_PROBS == "recompute"
    torch.manual_seed(0)
    old = torch.randn(4, 6) * 0.5
    behaviour = old + torch.randn(4, 6) * 0.6
    mask = (torch.rand(4, 6) > 0.2).float()
    theirs, _ = compute_rollout_correction_weights(old - behaviour, mask, rollout_is=corr.rollout_is,
                                                   rollout_is_threshold=corr.rollout_is_threshold)
    ours, _ = correct_advantages(CorrectionConfig(kind, level, 2.0), torch.ones(4), old, behaviour, mask)
    torch.testing.assert_close(theirs * mask, ours)
    assert ours.eq(0).logical_and(mask.bool()).any() or kind == "tis"  # mis did mask something here


@pytest.mark.parametrize("overrides, raw, message", [
    (["trainer.max_staleness=1", "trainer.partial_rollouts=false"], [], "partial rollouts always"),
    (["trainer.max_staleness=1"], ["trainer.use_v1=false"], "only verl's V1 trainer has asynchronous modes"),
    (["trainer.max_staleness=1", "algorithm.old_log_probs=update"], [], "would train as if the current one"),
    (["trainer.max_staleness=1", "rollout.dynamic_sampling.min_groups=16"], [], "verl's async trainers refill"),
    (["algorithm.correction.type=mis", "algorithm.old_log_probs=rollout"], [], "rollout_correction"),
])
def test_combinations_that_cannot_be_exact_are_refused_in_one_line(tmp_path, tiny_model_dir, overrides, raw, message):
    with pytest.raises(ConfigError, match=message) as info:
        cfg = compose(tmp_path, tiny_model_dir, overrides, raw)  # old-log-probs modes are refused here
        supported.check(cfg.rl_factory, cfg)  # the rest where the launcher checks the composed config
    assert "\n" not in str(info.value)


def test_verls_off_policy_metrics_get_our_async_names():
    from rl_factory.backends.verl.run_dir import our_metrics

    verl = {"training/off_policy/trajectory_staleness_worst/mean": 0.5,
            "training/off_policy/trajectory_staleness_worst/max": 1.0,
            "training/off_policy/trajectory_spans/mean": 1.25, "training/off_policy/trajectory_staleness/max": 0.0}
    assert our_metrics(verl) == {"async/staleness/mean": 0.5, "async/staleness/max": 1.0,
                                 "async/version_spans/mean": 1.25}
