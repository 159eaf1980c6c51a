"""The verl performance plan for real model shapes (pure arithmetic: no GPU, no verl import)."""
import pytest

from rl_factory.backends.verl.tuning import (GIB, MEMORY_FRACTION, MIN_KV_BYTES, VLLM_RUNTIME_BYTES, ModelDoesNotFit,
                                             ModelShape, Offload, plan)

H200 = 143771 * 1024**2
QWEN3_06B = ModelShape(params=596_049_920, layers=28, hidden=1024, heads_dim=2048, kv_dim=1024,
                       intermediate=3072, vocab=151936)
QWEN3_4B = ModelShape(params=4_022_468_096, layers=36, hidden=2560, heads_dim=4096, kv_dim=1024,
                      intermediate=9728, vocab=151936)
# the builtin tiny model (ModelShape.from_path of the one main_grpo.sh builds)
TINY = ModelShape(params=869_120, layers=4, hidden=128, heads_dim=128, kv_dim=64, intermediate=384, vocab=635)
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


H100 = 81559 * 1024**2
VLLM_LEAST = VLLM_RUNTIME_BYTES + MIN_KV_BYTES  # beside its bf16 weights: what vLLM needs to start


def test_4b_on_one_gpu_checkpoints_and_leaves_vllm_room_for_the_training_state():
    v = _values(QWEN3_4B)
    assert v["actor_rollout_ref.model.enable_gradient_checkpointing"] is True
    share = v["actor_rollout_ref.rollout.gpu_memory_utilization"]
    # through the rollout the trainer keeps fp32 weights and Adam's moments; verl's update has freed the gradients
    kept = 12 * QWEN3_4B.params + 3 * GIB
    assert share < 0.6 and share * H200 + kept <= 0.9 * H200
    # LoRA keeps no gradients or Adam moments for the base: vLLM gets its full share back
    assert _values(QWEN3_4B, lora=True)["actor_rollout_ref.rollout.gpu_memory_utilization"] == 0.6


def test_4b_on_one_80_gb_gpu_gives_vllm_its_weights_and_a_kv_cache():
    """The 4B shape on one H100 (2026-12-06): a share of 0.1 (the floor, from the trainer's state with its gradients)
    left vLLM -0.48 GiB for its KV cache after 7.56 GiB of weights, and vLLM's start failed after 100 s."""
    share = _values(QWEN3_4B, gpu_total=H100, longest_sequence=512)["actor_rollout_ref.rollout.gpu_memory_utilization"]
    assert share * H100 - 2 * QWEN3_4B.params - VLLM_RUNTIME_BYTES >= 8 * GIB  # ~65k tokens of KV cache, not none
    assert share * H100 + 12 * QWEN3_4B.params + 3 * GIB <= 0.9 * H100
    # with the optimizer state offloaded while vLLM runs, vLLM gets its full share
    offloaded = _values(QWEN3_4B, gpu_total=H100, longest_sequence=512, offload=Offload(optimizer=True))
    assert offloaded["actor_rollout_ref.rollout.gpu_memory_utilization"] == 0.6


def _rollout_state_gib(reasons):
    line = next(r for r in reasons if r.startswith("actor_rollout_ref.rollout.gpu_memory_utilization"))
    return int(line.rsplit("beside the ", 1)[1].split(" GiB")[0])


def _training_state_gib(reasons):
    line = next(r for r in reasons if r.startswith("actor_rollout_ref.actor.ppo_max_token_len_per_gpu"))
    return int(line.rsplit("after ", 1)[1].split(" GiB")[0])


def test_a_critic_keeps_its_weights_and_moments_beside_the_actor():
    """GAE: verl builds the critic from the actor's model and trains it on the same GPUs; outside its own update each
    model keeps 12 B/param there (weights and moments), through the other's update and through the rollout."""
    def tuned(**kw):
        return plan(QWEN3_4B, gpus=1, gpu_total=H200, longest_sequence=2048, lora=False, **{"critic": True, **kw})

    alone, with_critic = tuned(critic=False), tuned()
    twelve = 12 * QWEN3_4B.params / GIB
    assert _training_state_gib(with_critic.reasons) - _training_state_gib(alone.reasons) == pytest.approx(twelve, abs=1)
    assert _rollout_state_gib(with_critic.reasons) - _rollout_state_gib(alone.reasons) == pytest.approx(twelve, abs=1)  # rollout
    share = with_critic.values["actor_rollout_ref.rollout.gpu_memory_utilization"]
    assert share < alone.values["actor_rollout_ref.rollout.gpu_memory_utilization"]
    assert share * H200 + 24 * QWEN3_4B.params + 3 * GIB <= 0.9 * H200
    # the critic's state offloaded between its updates (critic.fsdp.*_offload): gone from the rollout, but the
    # critic's own update still runs beside the actor's weights and moments
    offloaded = tuned(critic_offload=Offload(params=True, optimizer=True))
    assert _rollout_state_gib(offloaded.reasons) == _rollout_state_gib(alone.reasons)
    assert _training_state_gib(offloaded.reasons) == _training_state_gib(with_critic.reasons)
    both = tuned(critic_offload=Offload(params=True, optimizer=True), offload=Offload(params=True, optimizer=True))
    assert _training_state_gib(both.reasons) == _training_state_gib(alone.reasons)  # each update alone
    # the 4B's actor and critic cannot train on one 80-GB GPU: refused before the launch, saying why
    with pytest.raises(ModelDoesNotFit, match="108 GiB.*GAE.*other model's weights and moments.*critic.fsdp"):
        _values(QWEN3_4B, gpu_total=H100, critic=True)
    assert _values(QWEN3_4B, gpu_total=H100, critic=False)  # the actor alone does


def test_a_rollout_without_room_for_vllms_weights_is_refused_naming_tensor_parallel():
    """32B over 16 GPUs of 80 GB: the training state fits (2 GB of it a billion parameters per GPU), but one vLLM
    replica per GPU needs the 61 GiB of bf16 weights each; split over 2 GPUs, they fit."""
    job = dict(gpus=16, gpu_total=80 * GIB)
    with pytest.raises(ModelDoesNotFit, match="vLLM needs at least 66.0 GiB.*tensor_model_parallel_size"):
        _values(QWEN3_32B, **job)
    share = _values(QWEN3_32B, **job, replica_gpus=2)["actor_rollout_ref.rollout.gpu_memory_utilization"]
    assert share * 80 * GIB >= QWEN3_32B.params + VLLM_LEAST


def test_a_model_that_cannot_fit_names_the_settings_to_change():
    with pytest.raises(ModelDoesNotFit, match="n_gpus_per_node.*lora_rank.*optimizer_offload"):
        _values(QWEN3_32B, gpu_total=80 * GIB)
    assert _values(QWEN3_32B, gpus=8)["actor_rollout_ref.model.enable_gradient_checkpointing"] in (True, False)


def test_unknown_model_keeps_the_model_independent_choices_only():
    v = plan(None, gpus=1, gpu_total=H200, longest_sequence=2048, lora=False, critic=False).values
    assert v["actor_rollout_ref.model.use_fused_kernels"] and "actor_rollout_ref.actor.ppo_max_token_len_per_gpu" not in v


def test_the_log_prob_kernel_is_tritons_where_triton_is_installed(monkeypatch):
    import importlib.util

    key = "actor_rollout_ref.model.fused_kernel_options.impl_backend"
    real = importlib.util.find_spec
    # this machine's torch is a CPU build: no Triton, the torch kernel
    assert (real("triton") is None) == (_values(QWEN3_4B)[key] == "torch")
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "triton" else real(name, *a))
    assert _values(QWEN3_4B)[key] == "triton"
    assert plan(None, gpus=1, gpu_total=H200, longest_sequence=2048, lora=False, critic=False).values[key] == "triton"


def test_adamw_is_torchs_fused_one_for_the_actor_and_the_critic():
    fused = {"fused": True}
    actor, critic = _values(QWEN3_4B), _values(QWEN3_4B, critic=True)
    assert actor["actor_rollout_ref.actor.optim.override_optimizer_config"] == fused
    assert "critic.optim.override_optimizer_config" not in actor
    assert critic["critic.optim.override_optimizer_config"] == fused
    # bitsandbytes' 8-bit AdamW for the actor: no `fused` for it, the critic's torch AdamW still fused
    other = _values(QWEN3_4B, critic=True, optimizers={"actor_rollout_ref.actor": "bitsandbytes.optim.AdamW8bit"})
    assert "actor_rollout_ref.actor.optim.override_optimizer_config" not in other
    assert other["critic.optim.override_optimizer_config"] == fused


def test_checkpointed_micro_batches_fit_the_4b_update_as_measured():
    # the 4B's allocator peak was 75.02 GiB at 4,409 tokens (H100) and at 32,768 (H200): the foreach optimizer's
    # temporary; the activations of 32,768 tokens stayed under 15 GiB, below the formula's 0.51 MB a token
    per_token = QWEN3_4B.activation_bytes_per_token(True)
    assert 32768 * per_token > 15 * GIB
    tokens = _values(QWEN3_4B, gpu_total=H100)["actor_rollout_ref.actor.ppo_max_token_len_per_gpu"]
    assert 8192 < tokens < 16384  # 4,409 with the slack that belongs to un-checkpointed layers only


def test_cuda_graphs_are_captured_for_the_decode_batches_the_rollout_reaches():
    # 16 prompts x 8 on one replica: 128 trajectories decode at once at most
    assert _values(None, concurrency=128)["actor_rollout_ref.rollout.cudagraph_capture_sizes"] == [
        1, 2, 4, 8, 16, 32, 64, 128]
    # never past vLLM's max_num_seqs (a larger batch runs in several decode batches)
    sizes = _values(None, concurrency=2048, max_num_seqs=256)["actor_rollout_ref.rollout.cudagraph_capture_sizes"]
    assert sizes[-1] == 256 and all(b == 2 * a for a, b in zip(sizes, sizes[1:]))
    assert _values(None, concurrency=300, max_num_seqs=300)["actor_rollout_ref.rollout.cudagraph_capture_sizes"][-1] == 300


def test_a_one_gpu_vllm_replica_captures_graphs_for_the_mixed_steps_that_add_a_turns_prompt():
    # full graphs for mixed batches are keyed by tokens: the decode batch plus the prompts that arrived since the
    # step before; 8x the decode batch, at least 1024 tokens, at most what one vLLM step takes
    key = "actor_rollout_ref.rollout.cudagraph_capture_sizes"
    assert _values(None, concurrency=128, vllm_request_tokens=256)[key] == [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]
    assert _values(None, concurrency=4, vllm_request_tokens=256)[key][-1] == 1024
    assert _values(None, concurrency=512, max_num_seqs=512, vllm_request_tokens=256)[key][-1] == 4096
    assert _values(None, concurrency=512, max_num_seqs=512, max_num_batched_tokens=3000,
                   vllm_request_tokens=256)[key][-1] == 2048
    # tensor parallel keeps vLLM's compiled piecewise graphs: the decode batches only
    assert _values(None, concurrency=128, vllm_request_tokens=256, replica_gpus=2)[key][-1] == 128


def test_vllm_streams_only_a_requests_first_token_and_final_output():
    # verl's server keeps only the final output; vLLM's per-step cumulative outputs were Python work for nothing
    key = "actor_rollout_ref.rollout.engine_kwargs.vllm.stream_interval"
    assert _values(None, vllm_request_tokens=1536)[key] == 1536
    assert key not in _values(None)  # another rollout engine (sglang) has no such argument


def test_a_one_gpu_vllm_replica_runs_its_model_in_the_engine_process():
    # verl asks for vLLM's multiprocess executor, one more process per replica at start-up; on one GPU it generated
    # no faster (H100, both in one invocation)
    key = "actor_rollout_ref.rollout.engine_kwargs.vllm.distributed_executor_backend"
    assert _values(None, vllm_request_tokens=1536)[key] == "uni"
    assert key not in _values(None, vllm_request_tokens=1536, replica_gpus=2)  # tensor parallel: vLLM's workers
    assert key not in _values(None)  # not vLLM


def test_a_one_gpu_vllm_replica_starts_without_torch_compile_and_runs_every_step_in_full_cuda_graphs():
    import json

    key = "actor_rollout_ref.rollout.engine_kwargs.vllm.compilation_config"
    value = json.loads(_values(None, vllm_request_tokens=1536)[key])
    assert value == {"mode": "NONE", "cudagraph_mode": "FULL"}
    assert key not in _values(None, vllm_request_tokens=1536, replica_gpus=2)  # tensor parallel: compiled passes
    assert key not in _values(None)  # not vLLM


def test_transfer_queue_starts_two_storage_units_a_node_instead_of_eight():
    """Each unit is a process started before training (tq.init: 16.8 s with 8, 5.4 s with 2 on a 2-core VM)."""
    key = "transfer_queue.backend.SimpleStorage.num_data_storage_units"
    assert _values(None, storage_units=8)[key] == 2
    assert _values(None, storage_units=8, nodes=3)[key] == 6
    assert key not in _values(None, storage_units=8, nodes=4)  # verl's 8 already is two a node
    assert key not in _values(None, storage_units=0)  # another storage backend (Mooncake) has no units


def test_vllm_kv_cache_holds_the_steps_trajectories_instead_of_filling_its_memory_share():
    # verl's prefix-cache reset at each weight sync walks every KV block: a tiny model's cache sized by the 0.6
    # share would be ~5M blocks
    key = "actor_rollout_ref.rollout.engine_kwargs.vllm.kv_cache_memory_bytes"
    job = dict(concurrency=128, vllm_request_tokens=512, longest_sequence=1536)  # 16 prompts x 8, 1024 + 512 tokens
    assert _values(TINY, **job)[key] == MIN_KV_BYTES  # 128 x 1536 tokens x 1 KiB, twice over: 0.4 GB
    tokens = 128 * 1536
    assert _values(QWEN3_06B, **job)[key] == 2 * tokens * (2 * 28 * 1024 * 2)  # 45 GB of the ~79 GB the share leaves
    assert _values(QWEN3_06B, **{**job, "concurrency": 64})[key] == tokens * (2 * 28 * 1024 * 2)
    # more than the share holds (4B on an 80-GB GPU: 58 GB > the ~12 GiB its share leaves; 0.6B at 32 prompts x 8
    # or 8k-token trajectories): vLLM sizes it from its share, as before; one H200 holds the 4B's (~66 GiB left)
    assert key not in _values(QWEN3_4B, **job, gpu_total=H100)
    assert _values(QWEN3_4B, **job)[key] == 2 * tokens * (2 * 36 * 1024 * 2)
    assert key not in _values(QWEN3_06B, **{**job, "concurrency": 256})
    assert key not in _values(QWEN3_06B, **{**job, "longest_sequence": 8192})
    assert key not in _values(QWEN3_06B, concurrency=128)  # not vLLM
    assert key not in _values(None, **job)  # shape unknown


def test_vllm_stays_awake_only_where_the_trainer_keeps_unchecked_8k_token_micro_batches_beside_it():
    awake, budget = "actor_rollout_ref.rollout.free_cache_engine", "actor_rollout_ref.actor.ppo_max_token_len_per_gpu"
    job = dict(concurrency=128, vllm_request_tokens=512, longest_sequence=1536)
    v = _values(QWEN3_06B, **job)
    # vLLM's weights, 42 GiB of KV cache and its runtime leave the trainer less than 32k tokens, still over 16k
    assert v[awake] is False and 16384 <= v[budget] < 32768
    assert v["actor_rollout_ref.model.enable_gradient_checkpointing"] is False
    asleep = _values(QWEN3_06B, **job, free_cache_engine=True)  # given on the command line: the trainer gets it all
    assert awake not in asleep and asleep[budget] == 32768
    # on an 80 GB GPU, 1536-token trajectories' 42 GiB of KV cache would leave the trainer under 8k tokens without
    # checkpointing: vLLM sleeps, verl's default; 512-token ones' 14 GiB leave it 8k-16k, and vLLM stays awake
    assert awake not in _values(QWEN3_06B, **job, gpu_total=80 * GIB)
    short = _values(QWEN3_06B, **job, trajectory_tokens=512, gpu_total=80 * GIB)
    assert short[awake] is False and 8192 <= short[budget] < 16384
    assert short["actor_rollout_ref.model.enable_gradient_checkpointing"] is False
    kv = "actor_rollout_ref.rollout.engine_kwargs.vllm.kv_cache_memory_bytes"
    assert short[kv] == 2 * 128 * 512 * (2 * 28 * 1024 * 2)
    # a trajectory cap above verl's padded length changes nothing: vLLM never holds more than that
    assert _values(QWEN3_06B, **job, trajectory_tokens=4096)[kv] == _values(QWEN3_06B, **job)[kv]
    # the 4B checkpoints on one H200 anyway: the trainer takes vLLM's memory every step
    assert awake not in _values(QWEN3_4B, **job)
    # vLLM sizing its cache from its whole share (256 trajectories) leaves nothing to plan the trainer on
    assert awake not in _values(QWEN3_06B, **{**job, "concurrency": 256})
    assert awake not in _values(QWEN3_06B)  # no vLLM
    assert _values(TINY, **job)[awake] is False


def test_vllm_kept_awake_on_the_command_line_leaves_the_trainer_what_it_holds_awake():
    # the budget planned as if vLLM slept ran the 0.6B shape's first update out of memory on an H100, vLLM holding
    # 43.9 GiB awake (its weights, 42 GiB of KV cache, its runtime)
    budget = "actor_rollout_ref.actor.ppo_max_token_len_per_gpu"
    ckpt = "actor_rollout_ref.model.enable_gradient_checkpointing"
    job = dict(concurrency=128, vllm_request_tokens=512, longest_sequence=1536)
    asleep = _values(QWEN3_06B, **job, gpu_total=H100)
    awake = _values(QWEN3_06B, **job, gpu_total=H100, free_cache_engine=False)
    held = 2 * QWEN3_06B.params + awake["actor_rollout_ref.rollout.engine_kwargs.vllm.kv_cache_memory_bytes"] \
        + VLLM_RUNTIME_BYTES
    # what is left beside vLLM holds fewer than 8k tokens without checkpointing: the trainer checkpoints
    assert asleep[ckpt] is False and awake[ckpt] is True
    # the awake micro-batch's activations and vLLM fit in what the asleep one had (its budget: under 20k+1 tokens)
    per_token = QWEN3_06B.activation_bytes_per_token
    assert asleep[budget] < 32768  # not capped: its tokens say its budget
    assert awake[budget] * per_token(True) + held < (asleep[budget] + 1) * per_token(False)
    # on an H200 the plan keeps vLLM awake itself; given or not, the same budget
    assert _values(QWEN3_06B, **job, free_cache_engine=False)[budget] == _values(QWEN3_06B, **job)[budget]
    # where nothing fits beside it (the 4B on an 80-GB GPU), one line names the key
    with pytest.raises(ModelDoesNotFit, match=r"free_cache_engine=false keeps vLLM's \d+ GiB .* not one 1536-token"
                                              r".*\(drop free_cache_engine=false\)$"):  # vLLM at its least: no room
        _values(QWEN3_4B, **job, gpu_total=H100, free_cache_engine=False)
    # 64k-token trajectories: vLLM sizes its KV cache from its share, and a smaller share would leave room
    with pytest.raises(ModelDoesNotFit, match=r"or give vLLM less: actor_rollout_ref.rollout.gpu_memory_utilization"):
        _values(QWEN3_06B, concurrency=256, vllm_request_tokens=512, longest_sequence=65536, gpu_total=H100,
                free_cache_engine=False)


def test_vllms_memory_given_on_the_command_line_is_what_the_trainer_is_planned_beside():
    """A KV cache or share given for vLLM is what the trainer's micro-batches and vLLM's sleep are planned beside,
    not the plan's own: on an H200 the plan keeps vLLM awake beside its 42-GiB KV cache, and a trainer planned
    so beside a 30-GiB larger one given on the command line would run out of memory at its first update."""
    kv = "actor_rollout_ref.rollout.engine_kwargs.vllm.kv_cache_memory_bytes"
    sleep = "actor_rollout_ref.rollout.free_cache_engine"
    budget = "actor_rollout_ref.actor.ppo_max_token_len_per_gpu"
    ckpt = "actor_rollout_ref.model.enable_gradient_checkpointing"
    job = dict(concurrency=128, vllm_request_tokens=512, longest_sequence=1536)
    per_token = QWEN3_06B.activation_bytes_per_token(False)
    trainer = int(H200 * MEMORY_FRACTION) - 16 * QWEN3_06B.params  # the trainer's room, less its state
    own = _values(QWEN3_06B, **job)
    assert own[sleep] is False and own[ckpt] is False
    for extra in (10, 30):
        given = _values(QWEN3_06B, **job, kv_cache_given=True, kv_cache_bytes=own[kv] + extra * GIB)
        assert kv not in given  # the given value stays: the plan sets no other
        if given.get(sleep) is False:  # awake beside the larger cache: micro-batches that fit beside it
            held = 2 * QWEN3_06B.params + own[kv] + extra * GIB + VLLM_RUNTIME_BYTES
            assert given[budget] < own[budget] and given[budget] * per_token + held < trainer
        else:  # too large to keep awake: vLLM sleeps, and the trainer has the GPU between rollouts
            assert extra == 30 and given[budget] == 32768
    # on an 80-GB GPU the plan's own KV cache puts vLLM to sleep; a 2-GiB one given leaves room to keep it awake
    assert sleep not in _values(QWEN3_06B, **job, gpu_total=H100)
    small = _values(QWEN3_06B, **job, gpu_total=H100, kv_cache_given=True, kv_cache_bytes=2 * GIB)
    assert small[sleep] is False and small[ckpt] is False and small[budget] >= 16384
    # the KV cache given as None (an engine_kwargs node without it): vLLM sizes it from its share, too little to plan
    # on, so vLLM sleeps
    assert sleep not in _values(QWEN3_06B, **job, kv_cache_given=True, kv_cache_bytes=None)
    # a share given: kept, and the plan's KV cache only where it fits in it (42 GiB do not fit in 8)
    share = _values(QWEN3_06B, **job, gpu_total=H100, share_given=0.1, free_cache_engine=False)
    assert share["actor_rollout_ref.rollout.gpu_memory_utilization"] == 0.1 and kv not in share
    assert share[ckpt] is False
    assert share[budget] * per_token + 0.1 * H100 < int(H100 * MEMORY_FRACTION) - 16 * QWEN3_06B.params


def test_missing_rollout_engine_is_one_line_naming_the_install():
    from omegaconf import OmegaConf

    from rl_factory.backends.verl.launcher import check_rollout_engine
    from rl_factory.config import ConfigError

    cfg = OmegaConf.create({"actor_rollout_ref": {"rollout": {"name": "no_such_engine_xyz"}}})
    with pytest.raises(ConfigError, match=r"no_such_engine_xyz is not installed.*setup.sh --verl"):
        check_rollout_engine(cfg)


@pytest.mark.parametrize("value_head_in", [None, "trl.experimental.ppo", "trl"])
def test_a_trl_that_verls_workers_cannot_import_from_is_refused_before_ray_starts(tmp_path, value_head_in):
    """verl's FSDP workers import trl's value-head model whenever trl is importable: trl 1.16 has none."""
    import os
    import subprocess
    import sys

    pkg = tmp_path / "trl"
    (pkg / "experimental" / "ppo").mkdir(parents=True)
    for module in ("trl", "trl.experimental", "trl.experimental.ppo"):
        body = "class AutoModelForCausalLMWithValueHead: ...\n" if module == value_head_in else ""
        (tmp_path / module.replace(".", "/") / "__init__.py").write_text(body)
    (tmp_path / "trl-9.9.dist-info").mkdir()
    (tmp_path / "trl-9.9.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: trl\nVersion: 9.9\n")
    code = "from rl_factory.backends.verl.launcher import check_trl; check_trl(); print('ok')"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(tmp_path)})
    if value_head_in is None:
        assert "ConfigError: trl 9.9 is installed beside verl" in proc.stderr and "pip uninstall trl" in proc.stderr
    else:
        assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr


@pytest.mark.slow  # runs main_grpo.sh
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


# ---- two GPUs: FSDP over 2 ranks, two vLLM replicas (tensor parallel 1) or one (tensor parallel 2) ----

QWEN3_8B = ModelShape(params=8_190_735_360, layers=36, hidden=4096, heads_dim=4096, kv_dim=1024,
                      intermediate=12288, vocab=151936)


def test_two_gpus_halve_the_sharded_training_state_per_gpu():
    one = plan(QWEN3_4B, gpus=1, gpu_total=H200, longest_sequence=2048, lora=False, critic=False)
    two = plan(QWEN3_4B, gpus=2, gpu_total=H200, longest_sequence=2048, lora=False, critic=False)
    # the 12 B/param of fp32 weights and Adam moments kept through the rollout are sharded; the CUDA context is not
    assert _rollout_state_gib(one.reasons) - _rollout_state_gib(two.reasons) == pytest.approx(6 * QWEN3_4B.params / GIB, abs=1)
    # so vLLM gets its full share back beside the trainer on each GPU (0.55 on one)
    assert one.values["actor_rollout_ref.rollout.gpu_memory_utilization"] < 0.6
    assert two.values["actor_rollout_ref.rollout.gpu_memory_utilization"] == 0.6
    # the 0.6B shape needs no checkpointing either way, and keeps the full micro-batch
    v = _values(QWEN3_06B, gpus=2)
    assert v["actor_rollout_ref.model.enable_gradient_checkpointing"] is False
    assert v["actor_rollout_ref.actor.ppo_max_token_len_per_gpu"] == 32768


def test_an_8b_model_that_one_h200_cannot_train_fits_on_two():
    with pytest.raises(ModelDoesNotFit, match="n_gpus_per_node"):
        _values(QWEN3_8B, gpus=1)
    v = _values(QWEN3_8B, gpus=2)
    assert v["actor_rollout_ref.model.enable_gradient_checkpointing"] is True
    assert 0.1 <= v["actor_rollout_ref.rollout.gpu_memory_utilization"] < 0.6


@pytest.mark.parametrize("gpus, tp, dp, replicas", [(1, 1, 1, 1), (2, 1, 1, 2), (2, 2, 1, 1), (8, 2, 2, 2)])
def test_replicas_are_gpus_over_a_replicas_size_and_share_the_steps_trajectories(gpus, tp, dp, replicas):
    from omegaconf import OmegaConf

    from rl_factory.backends.verl.config import _rollout_concurrency, rollout_replicas

    cfg = OmegaConf.create({"trainer": {"n_gpus_per_node": gpus, "nnodes": 1}, "data": {"train_batch_size": 16},
                            "actor_rollout_ref": {"rollout": {"n": 8, "tensor_model_parallel_size": tp,
                                                              "data_parallel_size": dp,
                                                              "pipeline_model_parallel_size": 1}}})
    assert rollout_replicas(cfg) == replicas
    assert _rollout_concurrency(cfg) == 16 * 8 // replicas


@pytest.mark.parametrize("mode, warmup, batches", [("sync", 0, 1), ("colocate_async", 1, 2), ("separate_async", 2, 3),
                                                   ("colocate_async", 0.5, 1.5)])
def test_an_async_trainer_decodes_its_warmup_batches_beside_the_steps_own(mode, warmup, batches):
    """verl queues `num_warmup_batches` more batches at the start and refills them after each step: the graphs
    and the KV cache are sized for all of them."""
    from omegaconf import OmegaConf

    from rl_factory.backends.verl.config import _rollout_concurrency

    cfg = OmegaConf.create({"trainer": {"n_gpus_per_node": 1, "nnodes": 1,
                                        "v1": {"trainer_mode": mode, mode: {"num_warmup_batches": warmup}}},
                            "data": {"train_batch_size": 16},
                            "actor_rollout_ref": {"rollout": {"n": 8, "tensor_model_parallel_size": 1}}})
    assert _rollout_concurrency(cfg) == 16 * 8 * batches


@pytest.mark.parametrize("argv, replicas, top_graph", [
    (["--gpus", "1"], 1, 128),                               # the one-GPU baseline: 16 x 8 on one replica
    (["--gpus", "2", "--tp", "1", "--batch", "32"], 2, 128),  # twice the prompts over two replicas
    (["--gpus", "2", "--tp", "2", "--batch", "32"], 1, 256),  # one replica over both GPUs
    (["--gpus", "2", "--tp", "1"], 2, 64),                    # the same 16 x 8 over two replicas
    (["--gpus", "1", "trainer.max_staleness=1"], 1, 256),    # async k=1: the step's batch and one more at once
])
@pytest.mark.slow  # composes verl's config, per case
def test_the_two_gpu_benchmark_commands_compose_and_pass_verls_checks(tmp_path, monkeypatch, argv, replicas, top_graph):
    """benchmarks/gpu_step.py's exact overrides, composed as main_grpo.sh does, planned for an H200."""
    pytest.importorskip("verl")
    from omegaconf import OmegaConf
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    import rl_factory.backends.verl.config as verl_config
    from benchmarks.gpu_step import parse_args, verl_overrides
    from benchmarks.shapes import shape_config_dir
    from rl_factory.backends.verl.config import compose_verl, rollout_replicas
    from rl_factory.backends.verl.launcher import absolute
    from rl_factory.config import load_config, parse, split_overrides

    monkeypatch.setattr(verl_config, "gpu_bytes", lambda: (H200, True))
    args = parse_args(["--shape", "qwen3-0.6b", "--no-ceilings", *argv])
    model = shape_config_dir("qwen3-0.6b", tmp_path)
    ours, raw = split_overrides(verl_overrides(args, model, tmp_path / "run"))
    cfg = compose_verl(absolute(parse(load_config("grpo", ours))), raw,
                       {"train": "/d/train.parquet", "val": "/d/val.parquet"}, str(model))
    OmegaConf.resolve(cfg)
    validate_config(cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))
    assert cfg.trainer.n_gpus_per_node == args.gpus and rollout_replicas(cfg) == replicas
    assert cfg.actor_rollout_ref.rollout.tensor_model_parallel_size == args.tp
    sizes = list(cfg.actor_rollout_ref.rollout.cudagraph_capture_sizes)
    assert top_graph in sizes and sizes == sorted(set(sizes))
    # a one-GPU replica replays mixed steps (a turn's prompt beside the decodes) in full graphs too: sizes in tokens
    assert sizes[-1] == (top_graph if args.tp > 1 else max(1024, 8 * top_graph))
    assert cfg.actor_rollout_ref.rollout.gpu_memory_utilization == 0.6
    assert cfg.actor_rollout_ref.model.enable_gradient_checkpointing is False
    # each replica's trajectories at `rollout.max_total_tokens` (512, the prompt included), twice over: the KV cache
    # is planned and vLLM stays awake beside the trainer, whose micro-batches shrink to what is left
    kv = 2 * top_graph * 512 * (2 * 28 * 1024 * 2)
    assert cfg.actor_rollout_ref.rollout.engine_kwargs.vllm.kv_cache_memory_bytes == kv
    tokens = cfg.actor_rollout_ref.actor.ppo_max_token_len_per_gpu
    assert cfg.actor_rollout_ref.rollout.free_cache_engine is False
    assert 16384 <= tokens <= 32768
    assert cfg.actor_rollout_ref.rollout.engine_kwargs.vllm.stream_interval == cfg.data.max_response_length
    executor = cfg.actor_rollout_ref.rollout.engine_kwargs.vllm.get("distributed_executor_backend")
    assert executor == ("uni" if args.tp == 1 else None)


def test_reading_a_hub_models_shape_never_asks_the_hub_for_it(tmp_path):
    """--cfg job and --doctor compose the plan: on a machine without network, asking the hub for the model's
    config waited on its retries for a minute. (huggingface_hub's own daily registry request may still come.)"""
    import http.server
    import subprocess
    import sys
    import threading

    paths = []

    class Hub(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - the handler's protocol
            paths.append(self.path)
            self.send_error(404)

        do_HEAD = do_GET

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    env = {"PATH": "/usr/bin:/bin", "HF_HOME": str(tmp_path / "hf"),
           "HF_ENDPOINT": f"http://127.0.0.1:{server.server_address[1]}"}
    code = "from rl_factory.backends.verl.tuning import ModelShape; print(ModelShape.from_path('Qwen/Qwen3-4B'))"
    try:
        done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    finally:
        server.shutdown()
    assert done.returncode == 0 and done.stdout.strip() == "None", done.stderr[-2000:]
    assert [p for p in paths if "Qwen3-4B" in p] == []


@pytest.mark.slow  # composes verl's config
def test_a_vllm_setting_given_on_the_command_line_inside_a_tuned_key_keeps_the_tuned_value_out(tmp_path, monkeypatch):
    """`+...compilation_config.mode=VLLM_COMPILE` is a key inside the tuned `compilation_config`: the user's dict
    stays as given, not replaced by the plan's JSON string (nor merged with it)."""
    pytest.importorskip("verl")
    import rl_factory.backends.verl.config as verl_config
    from benchmarks.gpu_step import parse_args, verl_overrides
    from benchmarks.shapes import shape_config_dir
    from rl_factory.backends.verl.config import compose_verl
    from rl_factory.backends.verl.launcher import absolute
    from rl_factory.config import load_config, parse, split_overrides

    monkeypatch.setattr(verl_config, "gpu_bytes", lambda: (H200, True))
    model = shape_config_dir("qwen3-0.6b", tmp_path)
    vllm = "actor_rollout_ref.rollout.engine_kwargs.vllm"
    for extra, expected in (([], {"mode": "NONE", "cudagraph_mode": "FULL"}),
                            ([f"+{vllm}.compilation_config.mode=VLLM_COMPILE"], {"mode": "VLLM_COMPILE"})):
        args = parse_args(["--shape", "qwen3-0.6b", "--no-ceilings", *extra])
        ours, raw = split_overrides(verl_overrides(args, model, tmp_path / "run"))
        cfg = compose_verl(absolute(parse(load_config("grpo", ours))), raw,
                           {"train": "/d/train.parquet", "val": "/d/val.parquet"}, str(model))
        value = cfg.actor_rollout_ref.rollout.engine_kwargs.vllm.compilation_config
        import json

        assert (json.loads(value) if isinstance(value, str) else dict(value)) == expected
        assert cfg.actor_rollout_ref.rollout.engine_kwargs.vllm.distributed_executor_backend == "uni"


@pytest.mark.slow  # composes verl's config
def test_a_kv_cache_given_on_the_command_line_reaches_the_plan_and_a_size_vllm_cannot_take_is_refused(
        tmp_path, monkeypatch):
    pytest.importorskip("verl")
    import rl_factory.backends.verl.config as verl_config
    from benchmarks.gpu_step import parse_args, verl_overrides
    from benchmarks.shapes import shape_config_dir
    from rl_factory.backends.verl.config import compose_verl
    from rl_factory.backends.verl.launcher import absolute
    from rl_factory.config import ConfigError, load_config, parse, split_overrides

    monkeypatch.setattr(verl_config, "gpu_bytes", lambda: (H100, True))
    model = shape_config_dir("qwen3-0.6b", tmp_path)
    key = "actor_rollout_ref.rollout.engine_kwargs.vllm.kv_cache_memory_bytes"

    def compose(*extra):
        ours, raw = split_overrides(verl_overrides(parse_args(["--shape", "qwen3-0.6b", "--no-ceilings", *extra]),
                                                   model, tmp_path / "run"))
        return compose_verl(absolute(parse(load_config("grpo", ours))), raw,
                            {"train": "/d/train.parquet", "val": "/d/val.parquet"}, str(model))

    # the step's 128 trajectories of 512 tokens (rollout.max_total_tokens), twice over: 14 GiB of KV cache leave the
    # trainer 8k-16k tokens a micro-batch beside vLLM awake, without checkpointing
    own = compose()
    assert own.actor_rollout_ref.rollout.engine_kwargs.vllm.kv_cache_memory_bytes == 2 * 128 * 512 * (2 * 28 * 1024 * 2)
    assert own.actor_rollout_ref.rollout.free_cache_engine is False
    assert own.actor_rollout_ref.model.enable_gradient_checkpointing is False
    assert 8192 <= own.actor_rollout_ref.actor.ppo_max_token_len_per_gpu < 16384
    # verl's own agent loop is held to verl's padded lengths only (1024 + 512): 42 GiB of KV cache, and vLLM sleeps
    verls = compose("actor_rollout_ref.rollout.agent.default_agent_loop=tool_agent")
    verls_kv = verls.actor_rollout_ref.rollout.engine_kwargs.vllm.kv_cache_memory_bytes
    assert verls_kv == 2 * 128 * 1536 * (2 * 28 * 1024 * 2)
    assert verls.actor_rollout_ref.rollout.free_cache_engine is True
    given = compose(f"+{key}={2 * GIB}")
    assert given.actor_rollout_ref.rollout.engine_kwargs.vllm.kv_cache_memory_bytes == 2 * GIB
    assert given.actor_rollout_ref.rollout.free_cache_engine is False  # awake beside the 2 GiB given
    # a size vLLM cannot take: the plan leaves it, and the config's check names it before anything starts
    from rl_factory.backends.verl.validate import check_verl_config

    unusable = compose(f"+{key}=16G")
    # planned as if not given: awake, with the trainer's micro-batches beside the plan's own 14 GiB
    assert unusable.actor_rollout_ref.rollout.free_cache_engine is False
    assert unusable.actor_rollout_ref.actor.ppo_max_token_len_per_gpu == \
        own.actor_rollout_ref.actor.ppo_max_token_len_per_gpu
    with pytest.raises(ConfigError, match=rf"^{key}='16G': must be null or an integer >= 1$"):
        check_verl_config(unusable)
