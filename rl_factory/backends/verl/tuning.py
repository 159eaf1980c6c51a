"""Per-run defaults for verl's FSDP actor and vLLM rollout, worked out from the model and the GPU.

verl's own defaults suit none of our runs well: flash-attn-only padding-free attention, padded
fixed-size micro-batches, full-vocab fp32 logits for every log-prob, gradient checkpointing always on,
a vLLM memory share that ignores what the trainer keeps on the GPU, and a KV cache that fills that share.
`plan()` decides each of these, and whether vLLM sleeps between rollouts, for the model at hand (its shape read
from its config, its size counted on the meta device) and the GPU's memory, and says why in one line each; any of
these keys set on the command line wins.

The memory model (bytes, per GPU, FSDP over `gpus` ranks, bf16 compute, fp32 master weights as verl
keeps them):
  static   = 16 P / gpus (fp32 weights, grads, Adam moments) + the bf16 copy of one layer gathered
             (LoRA: 4 P / gpus for the frozen fp32 base, adapters negligible)
             under GAE: the larger of the actor's update beside the critic's 12 P / gpus of weights and moments
             and the critic's (16 P / gpus) beside the actor's, each less what verl offloads between updates
  rollout  = 12 P / gpus (4 P with LoRA) and the critic's 12 P / gpus, less what verl offloads: no gradients
             while vLLM runs; vLLM's share is what 90% of the GPU leaves beside it
  per token= 2 L (6 h + 3 h_q + 2 h_kv + 4 i)   saved activations of a decoder layer, no checkpointing
             (times ACTIVATION_SLACK)
             2 L (2 h) + one layer's activations   with gradient checkpointing (no slack: measured below it)
The token budget of a micro-batch is what fits in `MEMORY_FRACTION` of the GPU after the static part;
checkpointing is switched on only when that budget without it would be below `MIN_TOKENS_PER_MICRO`
(or below the longest sequence). vLLM stays awake between rollouts where, beside its weights, its planned KV
cache and its runtime, the trainer keeps `AWAKE_MIN_TOKENS_PER_MICRO` tokens without checkpointing. These are
estimates, not measurements: the README's GPU table gives what was measured with them.
"""
from __future__ import annotations

import importlib.util
import logging
import math
from dataclasses import dataclass, field
from typing import Any

from rl_factory.backends.verl.vllm_engine import plan_engine
from rl_factory.base.errors import UserError

log = logging.getLogger("rl_factory.verl")

GIB = 1024**3
MEMORY_FRACTION = 0.85         # of the GPU, for the trainer while vLLM sleeps
CUDA_CONTEXT_BYTES = 3 * GIB   # per process: CUDA context, NCCL buffers, allocator slack
MIN_TOKENS_PER_MICRO = 16384   # below this, kernels run too small to keep an H100-class GPU busy
# vLLM stays awake where the trainer keeps this many tokens a micro-batch beside it without checkpointing. Asleep,
# every step frees and maps again vLLM's weights and KV cache and empties the actor's CUDA cache: the 0.6B shape's
# weight sync took 0.41 s asleep on an H100 (f909fb425cfc) against 0.10 s awake on an H200 (dccbb4f468e1), its
# update 0.57 of plain forward+backward against 0.75 (two launches each), and TRL keeps its colocated vLLM awake.
# A smaller micro-batch costs one more pass's kernel launches over the same tokens, not compute.
AWAKE_MIN_TOKENS_PER_MICRO = 8192
MAX_TOKENS_PER_MICRO = 32768   # above this, fewer micro-batches buy nothing
# The per-token formula counts the tensors a decoder layer saves in bf16; RMSNorm's fp32 upcasts,
# the rotated q/k copies and allocator fragmentation roughly double it in practice. With checkpointing the formula
# stands alone: the 4B shape's allocator peak was 75.02 GiB both with 4,409-token micro-batches (H100) and with
# 32,768 (H200): the foreach AdamW's full-size temporary over 60 GiB of training state, not the activations, which
# stayed under 15 GiB at 32,768 tokens (0.46 MB a token against the formula's 0.51).
ACTIVATION_SLACK = 2
ROLLOUT_MEMORY_SHARE = 0.6     # vLLM's share when the trainer's state leaves room for it
ASSUMED_GPU_BYTES = 80 * GIB   # when no GPU is visible here (--cfg job on a CPU machine, a remote Ray cluster)
# vLLM's KV cache: room for every trajectory a replica decodes at once at full length, twice over (no
# preemption), at least MIN_KV_BYTES. verl resets vLLM's prefix cache when it wakes vLLM for a weight sync,
# and vLLM's reset is a Python loop over every KV block: a share of the GPU given to a small model's KV cache
# is millions of blocks (the builtin tiny model's 1 KiB a token in ~80 GB: ~5M blocks; 4.9M took 0.2 s a loop
# on a 2-core VM with vLLM 0.24's own KVCacheBlock.reset_hash).
KV_SLACK = 2
MIN_KV_BYTES = 1 * GIB
VLLM_RUNTIME_BYTES = 4 * GIB   # vLLM's activations, CUDA graphs and sampler beside its weights and KV cache


@dataclass
class ModelShape:
    params: int
    layers: int
    hidden: int
    heads_dim: int      # query heads x head dim
    kv_dim: int         # key/value heads x head dim
    intermediate: int
    vocab: int

    @classmethod
    def from_path(cls, path: str) -> ModelShape | None:
        """The shape of the model at `path` (a local dir or a cached hub id), or None if unreadable."""
        try:
            import torch
            from transformers import AutoConfig, AutoModelForCausalLM

            # never the network: composing a config (--cfg job, --doctor) on a machine without one would wait on
            # the hub's retries; a hub id not downloaded yet is planned with verl's static defaults
            cfg = AutoConfig.from_pretrained(path, local_files_only=True)
            text = getattr(cfg, "text_config", None) or cfg
            with torch.device("meta"):
                params = sum(p.numel() for p in AutoModelForCausalLM.from_config(cfg).parameters())
        except Exception as exc:  # noqa: BLE001 - any failure means "plan without the model's shape"
            log.warning("verl tuning: cannot read the model config at %s (%s); using verl's static defaults",
                        path, exc)
            return None
        head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
        kv_heads = getattr(text, "num_key_value_heads", None) or text.num_attention_heads
        return cls(params, text.num_hidden_layers, text.hidden_size, text.num_attention_heads * head_dim,
                   kv_heads * head_dim, getattr(text, "intermediate_size", 4 * text.hidden_size), text.vocab_size)

    def kv_bytes_per_token(self) -> int:
        """vLLM's KV cache for one token: keys and values of every layer, bf16."""
        return 2 * self.layers * self.kv_dim * 2

    def activation_bytes_per_token(self, checkpointing: bool) -> int:
        layer = 2 * (6 * self.hidden + 3 * self.heads_dim + 2 * self.kv_dim + 4 * self.intermediate)
        if checkpointing:
            return 2 * self.layers * 2 * self.hidden + layer
        return ACTIVATION_SLACK * self.layers * layer


@dataclass
class Plan:
    values: dict[str, Any] = field(default_factory=dict)
    reasons: list[str] = field(default_factory=list)

    def set(self, key: str, value: Any, reason: str) -> None:
        self.values[key] = value
        self.reasons.append(f"{key}={value}: {reason}")


class ModelDoesNotFit(UserError, ValueError):
    """The model's training state alone exceeds the GPU: the message names the settings to change."""


TORCH_ADAMW = "torch.optim.AdamW"  # verl's default optimizer (optim.optimizer_impl + "." + optim.optimizer)
FUSABLE_OPTIMIZERS = {TORCH_ADAMW, "torch.optim.Adam"}


def log_prob_kernel() -> tuple[str, str]:
    """verl's fused log-prob kernel (`fused_kernel_options.impl_backend`) and why: Triton where it is installed (it
    comes with torch's CUDA builds), else the chunked torch one."""
    if importlib.util.find_spec("triton") is not None:
        return "triton", ("Triton is installed: forward+backward 2.2-3.7x faster than the torch kernel "
                          "(benchmarks/fused_logprob.py: 0.14 s against 0.32 s for 16,384 tokens of a 4B model)")
    return "torch", "no Triton here (a CPU build of torch): the chunked torch kernel"


def gpu_bytes() -> tuple[int, bool]:
    """Memory of GPU 0 here, and whether it was measured (else the assumed 80 GiB)."""
    try:
        import torch

        if torch.cuda.is_available():
            return torch.cuda.get_device_properties(0).total_memory, True
    except Exception:  # noqa: BLE001
        pass
    return ASSUMED_GPU_BYTES, False


def attention_implementation() -> str:
    """flash-attn's varlen kernel where the package is installed, else ours on torch's own kernel."""
    return "flash_attention_2" if importlib.util.find_spec("flash_attn") else "rl_factory_varlen"


def vllm_bytes(shape: ModelShape, kv_cache: int, replica_gpus: int = 1) -> int:
    """What a vLLM replica holds on each of its GPUs: its bf16 weights (split over the replica's GPUs), `kv_cache`
    bytes of KV cache and its runtime."""
    return 2 * shape.params // replica_gpus + kv_cache + VLLM_RUNTIME_BYTES


def awake_budget(shape: ModelShape, budget: int, checkpointing: bool, need: int, kv_cache: int | None) -> int | None:
    """The trainer's activation budget with vLLM awake beside it, or None where vLLM should sleep between rollouts.

    Awake, vLLM keeps its weights, its KV cache and its runtime (`kv_cache`: the KV bytes planned; None when vLLM
    sizes its cache from its whole share, which leaves the trainer too little to plan on). It stays awake only
    where the trainer loses nothing that matters: no gradient checkpointing, and still `need` tokens
    (`awake_need`: 8k, or the longest sequence) a micro-batch. Where memory is tight (a 4B model on one GPU
    checkpoints), the trainer gets vLLM's memory back every step, as verl does by default.
    """
    if kv_cache is None or checkpointing:
        return None
    awake = budget - vllm_bytes(shape, kv_cache)
    return awake if awake // shape.activation_bytes_per_token(False) >= need else None


def awake_need(longest_sequence: int) -> int:
    """Tokens a micro-batch must still hold without checkpointing for vLLM to stay awake beside the trainer."""
    return max(AWAKE_MIN_TOKENS_PER_MICRO, longest_sequence)


def beside_awake_vllm(shape: ModelShape, budget: int, static: int, share_bytes: float, kv_cache: int | None,
                      longest_sequence: int) -> tuple[int, bool, str]:
    """The trainer's activation budget, whether it checkpoints, and why, where the command line keeps vLLM awake
    (`rollout.free_cache_engine=false`): beside vLLM's weights, KV cache and runtime, or its whole share where vLLM
    sizes its cache from it. A budget planned as if vLLM slept ran the 0.6B shape's first update out of memory on
    an 80-GB GPU (H100, ff5d6b6e84f3: vLLM held 43.9 GiB awake)."""
    held = vllm_bytes(shape, kv_cache) if kv_cache is not None else int(share_bytes)
    awake = budget - held
    fits = lambda left: left // shape.activation_bytes_per_token(True) >= longest_sequence  # noqa: E731
    if not fits(awake):
        # giving vLLM less helps only where vLLM at its least (weights, runtime, 1 GiB of KV cache) leaves room
        less = (" or give vLLM less: " + ("actor_rollout_ref.rollout.engine_kwargs.vllm.kv_cache_memory_bytes (its KV "
                                           "cache)" if kv_cache is not None else
                                           "actor_rollout_ref.rollout.gpu_memory_utilization")
                if fits(budget - vllm_bytes(shape, MIN_KV_BYTES)) else "")
        raise ModelDoesNotFit(
            f"actor_rollout_ref.rollout.free_cache_engine=false keeps vLLM's {held / GIB:.0f} GiB on the GPU through "
            f"the update, leaving the trainer {max(0, awake) / GIB:.1f} GiB beside its {static / GIB:.0f} GiB of "
            f"training state: not one {longest_sequence}-token sequence fits. Let vLLM sleep between rollouts (drop "
            f"free_cache_engine=false){less}")
    # the micro-batch the plan keeps vLLM awake beside by itself: no checkpointing where it fits
    checkpointing = awake // shape.activation_bytes_per_token(False) < awake_need(longest_sequence)
    return awake, checkpointing, (f"{awake / GIB:.0f} GiB left for activations beside vLLM kept awake "
                                  f"({held / GIB:.0f} GiB) and {static / GIB:.0f} GiB of training state")


@dataclass(frozen=True)
class Offload:
    """verl's CPU offload of one model between its updates (the actor's `actor.fsdp_config.*_offload`, the critic's
    `critic.fsdp.*_offload`): what is not on the GPU outside them. verl loads both back for the model's own update,
    so that update's budget is the same either way."""
    params: bool = False
    optimizer: bool = False


def kept_between_updates(shape: ModelShape, *, gpus: int, lora: bool, offload: Offload = Offload()) -> int:
    """What one model's training keeps on each GPU outside its own update: fp32 weights and Adam's moments (LoRA:
    the frozen base), less what verl offloads. No gradients: verl's update frees them on its way out
    (`optimizer.zero_grad()`, set to None, in the engine's train-mode exit)."""
    weights = 0 if offload.params else 4 * shape.params
    moments = 0 if lora or offload.optimizer else 8 * shape.params
    return (weights + moments) // gpus


def critic_state(shape: ModelShape, *, gpus: int, critic: bool, offload: Offload = Offload()) -> int:
    """A critic's (GAE) share of each GPU outside its update: verl builds it from the actor's model (its value head
    in place of the LM head: about as many parameters), trained in full, on the same GPUs."""
    return kept_between_updates(shape, gpus=gpus, lora=False, offload=offload) if critic else 0


def rollout_state(shape: ModelShape, *, gpus: int, lora: bool, offload: Offload = Offload(), critic: bool = False,
                  critic_offload: Offload = Offload()) -> int:
    """What the trainer keeps on each GPU while vLLM generates: the actor's and a critic's weights and moments
    (`kept_between_updates`) and the CUDA context; vLLM's share can use the room the gradients take during an
    update."""
    return (kept_between_updates(shape, gpus=gpus, lora=lora, offload=offload) + CUDA_CONTEXT_BYTES
            + critic_state(shape, gpus=gpus, critic=critic, offload=critic_offload))


def rollout_share(shape: ModelShape, *, gpus: int, gpu_total: int, lora: bool, replica_gpus: int = 1,
                  offload: Offload = Offload(), critic: bool = False, critic_offload: Offload = Offload()) -> float:
    """vLLM's `gpu_memory_utilization`: what is left of 90% of the GPU beside `rollout_state` (at most
    ROLLOUT_MEMORY_SHARE), and never less than vLLM needs to start: its bf16 weights (split over a replica's
    GPUs), its runtime and MIN_KV_BYTES of KV cache. vLLM sizes its KV cache from this share minus the weights and
    its runtime: a share below that fails at vLLM's start ("No available memory for the cache blocks") after
    minutes of start-up, so a GPU without room for it is refused here, where --cfg job and --doctor see it."""
    kept = rollout_state(shape, gpus=gpus, lora=lora, offload=offload, critic=critic, critic_offload=critic_offload)
    room = gpu_total * 0.9 - kept
    least = vllm_bytes(shape, MIN_KV_BYTES, replica_gpus)
    if least > room:
        raise ModelDoesNotFit(
            f"vLLM needs at least {least / GIB:.1f} GiB per GPU for a {shape.params / 1e9:.1f}B-parameter model (its "
            f"bf16 weights, its runtime and {MIN_KV_BYTES / GIB:.0f} GiB of KV cache), and the trainer keeps "
            f"{kept / GIB:.0f} GiB of its {gpu_total / GIB:.0f} GiB through the rollout (weights and optimizer "
            f"state{', a critic included' if critic else ''}): split vLLM's weights over more GPUs "
            "(actor_rollout_ref.rollout.tensor_model_parallel_size), offload the optimizer state while vLLM runs "
            "(actor_rollout_ref.actor.fsdp_config.optimizer_offload=true), train LoRA adapters (model.lora_rank=64) or "
            "raise trainer.n_gpus_per_node (or nnodes)")
    # down to the hundredth (up would ask vLLM for more than the room), but never below what vLLM needs
    share = math.floor(100 * min(ROLLOUT_MEMORY_SHARE * gpu_total, room) / gpu_total) / 100
    return max(share, math.ceil(100 * least / gpu_total) / 100)


def plan(shape: ModelShape | None, *, gpus: int, gpu_total: int, longest_sequence: int, lora: bool,
         critic: bool, concurrency: int = 0, max_num_seqs: int = 256, max_num_batched_tokens: int = 8192,
         vllm_request_tokens: int = 0, trajectory_tokens: int | None = None,
         replica_gpus: int = 1, nodes: int = 1, storage_units: int = 0, free_cache_engine: bool | None = None,
         offload: Offload = Offload(), critic_offload: Offload = Offload(), share_given: float | None = None,
         kv_cache_given: bool = False, kv_cache_bytes: int | None = None,
         optimizers: dict[str, str] | None = None) -> Plan:
    """verl key -> value for the performance settings (see the module docstring).

    `concurrency`: the trajectories one rollout replica may decode at once (prompts x n / replicas).
    `max_num_seqs`, `max_num_batched_tokens`: vLLM's, as configured (the most requests and tokens of one step).
    `vllm_request_tokens`: the most tokens one vLLM request can generate (0: the rollout is not vLLM).
    `trajectory_tokens`: the most tokens one trajectory holds in vLLM's KV cache, where the agent loop ends it
    sooner than `longest_sequence` (verl's padded prompt + response, which the trainer's micro-batches must hold).
    `replica_gpus`: the GPUs of one rollout replica (tensor x data x pipeline parallel).
    `storage_units`: TransferQueue's SimpleStorage units as configured (0: another storage backend).
    `free_cache_engine`: the value given on the command line (None: the plan decides whether vLLM sleeps).
    `offload`, `critic_offload`: verl's offload of the actor's (the critic's) parameters and optimizer state outside
    its update, as configured.
    `share_given`: vLLM's gpu_memory_utilization given on the command line; `kv_cache_given`: its
    kv_cache_memory_bytes was (`kv_cache_bytes`: the value; None: vLLM sizes its KV cache from its share). The
    trainer is planned beside what vLLM will hold, not beside what the plan would have given it: a plan that kept
    vLLM awake beside its own 42-GiB KV cache would leave a trainer beside a larger given one out of memory.
    `optimizers`: each model's optimizer class as verl will import it (`actor_rollout_ref.actor` ->
    `torch.optim.AdamW`, verl's default where absent); only torch's Adam and AdamW get `fused`.
    """
    optimizers = optimizers or {}
    out = Plan()
    if 2 * nodes < storage_units:
        # each unit is a Ray actor process the TaskRunner starts, and waits for, before anything else; tq.init took
        # 16.8 s with verl's 8 and 5.4 s with 2 on a 2-core VM (Ray up, 16 logical CPUs). A step's batch (128
        # trajectories of the 0.6B job) is a few MB: two units hold it.
        out.set("transfer_queue.backend.SimpleStorage.num_data_storage_units", 2 * nodes,
                "TransferQueue's storage units are processes started before training: two a node, as "
                "TransferQueue recommends, instead of 8")
    plan_engine(out, concurrency=concurrency, max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                vllm_request_tokens=vllm_request_tokens, replica_gpus=replica_gpus)
    attn = attention_implementation()
    why = ("flash-attn is installed" if attn == "flash_attention_2" else
           "no flash-attn: torch's FlashAttention varlen kernel on packed sequences (rl_factory/models/varlen_attention.py)")
    for prefix in ("actor_rollout_ref.model", *(("critic.model",) if critic else ())):
        out.set(f"{prefix}.override_config.attn_implementation", attn, why)
    out.set("actor_rollout_ref.model.use_remove_padding", True, "packed micro-batches: no compute on padding")
    out.set("actor_rollout_ref.actor.use_dynamic_bsz", True, "micro-batches by token budget, not by sequence count")
    out.set("actor_rollout_ref.model.use_fused_kernels", True,
            "log-probs from hidden states in vocab chunks: full-vocab fp32 logits are never materialized")
    backend, why = log_prob_kernel()
    out.set("actor_rollout_ref.model.fused_kernel_options.impl_backend", backend, why)
    for prefix in ("actor_rollout_ref.actor", *(("critic",) if critic else ())):
        if optimizers.get(prefix, TORCH_ADAMW) not in FUSABLE_OPTIMIZERS:  # another library's takes no `fused`
            continue
        # verl builds torch's AdamW with foreach, whose step allocates a temporary the size of the fp32 weights
        # (15 GiB at 4B: the update's memory peak) and runs one kernel per op over the parameter list
        out.set(f"{prefix}.optim.override_optimizer_config", {"fused": True},
                "torch's fused AdamW: one kernel a step and no weight-sized temporary (the foreach one's set the "
                "4B update's memory peak)")
    out.set("data.dataloader_num_workers", 0,
            "rows are tokenized in microseconds; worker processes only outlive the job (a 'killed by signal' traceback)")
    if shape is None:
        return out
    # under GAE each model's update runs beside the other's weights and moments (its gradients freed), the critic's
    # with the same micro-batch budget (the two are the same size)
    train = (4 if lora else 16) * shape.params // gpus
    if critic:
        train = max(train + critic_state(shape, gpus=gpus, critic=True, offload=critic_offload),
                    16 * shape.params // gpus + kept_between_updates(shape, gpus=gpus, lora=lora, offload=offload))
    static = train + 2 * shape.params // max(1, shape.layers) + CUDA_CONTEXT_BYTES
    budget = int(gpu_total * MEMORY_FRACTION) - static
    need = max(MIN_TOKENS_PER_MICRO, longest_sequence)
    if budget <= 0 or budget // shape.activation_bytes_per_token(True) < longest_sequence:
        gae = (". Under GAE each update runs beside the other model's weights and moments (the critic's, the actor's): "
               "offloading both between their updates (param_offload and optimizer_offload under "
               "actor_rollout_ref.actor.fsdp_config and critic.fsdp) leaves each update alone" if critic else "")
        raise ModelDoesNotFit(
            f"a {shape.params / 1e9:.1f}B-parameter model needs about {static / GIB:.0f} GiB per GPU for its training "
            f"state on {gpus} GPU(s) of {gpu_total / GIB:.0f} GiB, leaving no room for one {longest_sequence}-token "
            "sequence: raise trainer.n_gpus_per_node (or nnodes) or train LoRA adapters (model.lora_rank=64) (verl's "
            f"optimizer_offload frees the GPU between updates, not during one){gae}")
    no_ckpt = budget // shape.activation_bytes_per_token(False)
    checkpointing = no_ckpt < need
    fits = f"{budget / GIB:.0f} GiB left for activations after {static / GIB:.0f} GiB of training state"
    share = share_given if share_given is not None else rollout_share(
        shape, gpus=gpus, gpu_total=gpu_total, lora=lora, replica_gpus=replica_gpus, offload=offload, critic=critic,
        critic_offload=critic_offload)
    kept = rollout_state(shape, gpus=gpus, lora=lora, offload=offload, critic=critic, critic_offload=critic_offload)
    whose = ", the critic's included" if critic else ""
    out.set("actor_rollout_ref.rollout.gpu_memory_utilization", share,
            f"vLLM's weights and KV cache beside the {kept / GIB:.0f} GiB the trainer keeps through the rollout "
            f"(weights and optimizer state{whose}, no gradients)")
    kv_cache = kv_cache_bytes if kv_cache_given else None
    if vllm_request_tokens > 0 and concurrency > 0 and not kv_cache_given:
        # per GPU as if unsharded: tensor parallelism only makes the real need smaller
        held = min(longest_sequence, trajectory_tokens or longest_sequence)
        kv_need = max(MIN_KV_BYTES, KV_SLACK * concurrency * held * shape.kv_bytes_per_token())
        kv_room = int(share * gpu_total) - vllm_bytes(shape, 0)
        if kv_need < kv_room:  # else vLLM sizes it from its share, as before: it holds less than the step can use
            kv_cache = kv_need
            out.set("actor_rollout_ref.rollout.engine_kwargs.vllm.kv_cache_memory_bytes", kv_need,
                    f"{kv_need / GIB:.1f} GiB of KV cache: {concurrency} trajectories of {held} tokens, "
                    f"twice over, instead of the ~{kv_room / GIB:.0f} GiB left in vLLM's share, whose every block "
                    "verl's prefix-cache reset walks at each weight sync")
    if free_cache_engine is False:  # kept awake on the command line: the trainer plans beside vLLM, whatever it costs
        budget, checkpointing, fits = beside_awake_vllm(shape, budget, static, share * gpu_total, kv_cache,
                                                        longest_sequence)
        no_ckpt = budget // shape.activation_bytes_per_token(False)
    awake = awake_budget(shape, budget, checkpointing, awake_need(longest_sequence), kv_cache) \
        if free_cache_engine is None else None
    if awake is not None:
        # verl's default (free_cache_engine=true) puts vLLM to sleep after every rollout and wakes it at every weight
        # sync: its weights and KV cache are freed and mapped again, and the actor's CUDA cache is emptied for them
        budget = awake
        fits = f"{budget / GIB:.0f} GiB left for activations beside vLLM and {static / GIB:.0f} GiB of training state"
        out.set("actor_rollout_ref.rollout.free_cache_engine", False,
                f"vLLM stays awake between rollouts ({fits}, still {awake_need(longest_sequence)} tokens a "
                "micro-batch without checkpointing): no step frees its weights and KV cache and maps them again")
    tokens = budget // shape.activation_bytes_per_token(checkpointing)
    tokens = max(longest_sequence, min(MAX_TOKENS_PER_MICRO, tokens))
    out.set("actor_rollout_ref.model.enable_gradient_checkpointing", checkpointing,
            f"{fits}: {no_ckpt} tokens fit without it" + (" (too few)" if checkpointing else ""))
    out.set("actor_rollout_ref.actor.ppo_max_token_len_per_gpu", tokens, f"tokens per micro-batch that fit ({fits})")
    forward = max(longest_sequence, min(2 * MAX_TOKENS_PER_MICRO, 2 * tokens))
    for key in ("actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu",
                "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu"):
        out.set(key, forward, "forward only: no saved activations, twice the training budget")
    out.set("actor_rollout_ref.rollout.log_prob_use_dynamic_bsz", True, "old log-probs by token budget too")
    out.set("actor_rollout_ref.ref.log_prob_use_dynamic_bsz", True, "reference log-probs by token budget too")
    if critic:
        out.set("critic.use_dynamic_bsz", True, "as the actor")
        out.set("critic.ppo_max_token_len_per_gpu", tokens, "as the actor")
        out.set("critic.model.enable_gradient_checkpointing", checkpointing, "as the actor")
    return out
