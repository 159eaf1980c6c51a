"""The verl performance plan for real model shapes (pure arithmetic: no GPU, no verl import)."""
import pytest

from rl_factory.backends.verl.tuning import GIB, ModelDoesNotFit, ModelShape, plan

H200 = 143771 * 1024**2
QWEN3_06B = ModelShape(params=596_049_920, layers=28, hidden=1024, heads_dim=2048, kv_dim=1024,
                       intermediate=3072, vocab=151936)
QWEN3_4B = ModelShape(params=4_022_468_096, layers=36, hidden=2560, heads_dim=4096, kv_dim=1024,
                      intermediate=9728, vocab=151936)
QWEN3_32B = ModelShape(params=32_762_123_264, layers=64, hidden=5120, heads_dim=8192, kv_dim=1024,
                       intermediate=25600, vocab=151936)


def _values(shape, **kw):
    args = dict(gpus=1, gpu_total=H200, longest_sequence=2048, lora=False, critic=False) | kw
    return plan(shape, **args).values


def test_small_model_trains_without_checkpointing_in_large_micro_batches():
    v = _values(QWEN3_06B)
    assert v["actor_rollout_ref.model.enable_gradient_checkpointing"] is False
    assert v["actor_rollout_ref.actor.ppo_max_token_len_per_gpu"] == 32768
    assert v["actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu"] == 65536
    assert v["actor_rollout_ref.rollout.gpu_memory_utilization"] == 0.6


def test_4b_on_one_gpu_checkpoints_and_leaves_vllm_room_for_the_training_state():
    v = _values(QWEN3_4B)
    assert v["actor_rollout_ref.model.enable_gradient_checkpointing"] is True
    share = v["actor_rollout_ref.rollout.gpu_memory_utilization"]
    static = 16 * QWEN3_4B.params
    assert share < 0.6 and share * H200 + static < 0.95 * H200
    # LoRA keeps no gradients or Adam moments for the base: vLLM gets its full share back
    assert _values(QWEN3_4B, lora=True)["actor_rollout_ref.rollout.gpu_memory_utilization"] == 0.6


def test_a_model_that_cannot_fit_names_the_settings_to_change():
    with pytest.raises(ModelDoesNotFit, match="n_gpus_per_node.*lora_rank.*optimizer_offload"):
        _values(QWEN3_32B, gpu_total=80 * GIB)
    assert _values(QWEN3_32B, gpus=8)["actor_rollout_ref.model.enable_gradient_checkpointing"] in (True, False)


def test_unknown_model_keeps_the_model_independent_choices_only():
    v = plan(None, gpus=1, gpu_total=H200, longest_sequence=2048, lora=False, critic=False).values
    assert v["actor_rollout_ref.model.use_fused_kernels"] and "actor_rollout_ref.actor.ppo_max_token_len_per_gpu" not in v


def test_cuda_graphs_are_captured_for_the_decode_batches_the_rollout_reaches():
    # 16 prompts x 8 on one replica: 128 trajectories decode at once at most
    assert _values(None, concurrency=128)["actor_rollout_ref.rollout.cudagraph_capture_sizes"] == [
        1, 2, 4, 8, 16, 32, 64, 128]
    # never past vLLM's max_num_seqs (a larger batch runs in several decode batches)
    sizes = _values(None, concurrency=2048, max_num_seqs=256)["actor_rollout_ref.rollout.cudagraph_capture_sizes"]
    assert sizes[-1] == 256 and all(b == 2 * a for a, b in zip(sizes, sizes[1:]))
    assert _values(None, concurrency=300, max_num_seqs=300)["actor_rollout_ref.rollout.cudagraph_capture_sizes"][-1] == 300


def test_missing_rollout_engine_is_one_line_naming_the_install():
    from omegaconf import OmegaConf

    from rl_factory.backends.verl.launcher import check_rollout_engine
    from rl_factory.config import ConfigError

    cfg = OmegaConf.create({"actor_rollout_ref": {"rollout": {"name": "no_such_engine_xyz"}}})
    with pytest.raises(ConfigError, match=r"no_such_engine_xyz is not installed.*setup.sh --verl"):
        check_rollout_engine(cfg)


def test_a_model_too_large_for_the_gpus_stops_the_launch_with_one_line(tmp_path):
    """Only config.json is needed: the plan counts parameters on the meta device."""
    import os
    import subprocess
    import sys

    from transformers import Qwen3Config

    pytest.importorskip("verl")
    big = tmp_path / "qwen3-32b-shape"
    Qwen3Config(vocab_size=151936, hidden_size=5120, intermediate_size=25600, num_hidden_layers=64,
                num_attention_heads=64, num_key_value_heads=8, head_dim=128).save_pretrained(big)
    root = __import__("pathlib").Path(__file__).resolve().parents[2]
    run = subprocess.run(["bash", "main_grpo.sh", "trainer.backend=verl", "trainer.n_gpus_per_node=1",
                          f"model.path={big}", "--cfg", "job"], cwd=root, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHON": sys.executable})
    assert run.returncode == 2, run.stderr[-2000:]
    assert "n_gpus_per_node" in run.stderr and "lora_rank" in run.stderr and "Traceback" not in run.stderr


def test_a_checkout_that_is_not_installed_is_refused_before_ray_starts(monkeypatch):
    """Importable from PYTHONPATH is not enough: verl's workers load us through the entry point only."""
    import importlib.metadata

    pytest.importorskip("verl")
    from rl_factory.backends.verl.launcher import check_plugin
    from rl_factory.config import ConfigError

    check_plugin("grpo", "ppo_clip")  # the dev install has the entry point
    monkeypatch.setattr(importlib.metadata, "entry_points", lambda group=None: [])
    with pytest.raises(ConfigError, match="not installed as a package"):
        check_plugin("grpo", "ppo_clip")
