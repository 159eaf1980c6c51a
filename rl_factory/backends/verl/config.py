"""verl's composed config from ours: `configs/verl.yaml` (verl's ppo_trainer + our defaults) + the mapping.

`compose_verl(ours, raw_overrides, ...)` (`ours`: our parsed config, rl_factory.config.RunConfig) composes
`configs/verl.yaml` with the raw verl overrides the user gave (any verl key), then writes the values derived
from our config (`verl_values`, a table) into every key the user did not set directly, and stores our whole
config under `rl_factory`, where the agent loop and the metrics logger parse it (the reward adapter gets its
slices as reward_kwargs). So `rollout.n=16` sets `actor_rollout_ref.rollout.n`,
and an explicit `actor_rollout_ref.rollout.n=4` on the same command line would win.

Keys of ours with no verl counterpart stay ours (`env.*`, `rollout.max_response_tokens`, `context`,
`algorithm.arena`, `reward.*`): the agent loop and the reward adapter apply them. `model.device`,
`model.dtype` and `model.num_threads` do not apply (verl places models on its GPUs).
"""
from __future__ import annotations

import copy
import json
import logging
import math
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict

from rl_factory.backends.verl import actor_cache, fetch, old_log_probs, sampling_logprobs
from rl_factory.backends.verl.asynchrony import async_values, batches_in_flight
from rl_factory.backends.verl.agent_loop import AGENT_NAME, agent_loop_config_path
from rl_factory.backends.verl.pipeline import pipeline_values
from rl_factory.backends.verl.plugin import AGG_NAMES, OPTIONS_ENV
from rl_factory.backends.verl.run_dir import LOGGER_NAME
from rl_factory.backends.verl.sampler import sampler_values
from rl_factory.backends.verl.tuning import ModelDoesNotFit, ModelShape, Offload, Plan, gpu_bytes, plan
from rl_factory.backends.verl.validate import VERL_VALUE_RULES, verl_defaults
from rl_factory.config import CONFIG_DIR, ConfigError, RunConfig, _has_key, _short, closest_key_hint

log = logging.getLogger("rl_factory.verl")

REWARD_FN_PATH = "pkg://rl_factory.backends.verl.reward"
# our trainer.logger names -> verl's (jsonl -> our metrics.jsonl and rollouts, written by run_dir.RunDirLogger)
LOGGERS = {"console": "console", "jsonl": LOGGER_NAME, "tensorboard": "tensorboard", "wandb": "wandb"}
# Options verl's algorithm config holds itself; the rest travel in OPTIONS_ENV (see plugin.py).
VERL_OPTIONS = {"norm_by_std", "gamma", "lam"}
# Ray's runtime env: its variables reach every worker of every node, and are text only
ENV_VARS = "ray_kwargs.ray_init.runtime_env.env_vars"


def verl_values(ours: RunConfig, data_files: dict[str, str], model_path: str) -> dict[str, Any]:
    """verl key -> value for everything our config decides (the mapping table)."""
    alg, roll, optim, t, data = ours.algorithm, ours.rollout, ours.optim, ours.trainer, ours.data
    opts = dict(alg.advantage_options or {})
    out_dir = Path(t.output_dir)
    micro = optim.micro_batch_size
    model_path = model_path.rstrip("/") or model_path  # verl asserts on a trailing slash
    values: dict[str, Any] = {
        # model and data
        "actor_rollout_ref.model.path": model_path,
        "critic.model.path": model_path,
        # LoRA. After every update verl merges the adapters into a copy of the weights and syncs those, as in full
        # fine-tuning: vLLM's own adapter path (lora.merge=false) lost the adapter on the H200 (vLLM 0.24's
        # add_lora got no layers, 2026-12-01), and merged weights decode without LoRA kernels. The cost is a
        # full-weight sync per step (0.42 s for the 4B shape) instead of the adapter's.
        "actor_rollout_ref.model.lora.merge": ours.model.lora_rank > 0,
        "actor_rollout_ref.model.lora_rank": ours.model.lora_rank,
        "actor_rollout_ref.model.lora_alpha": ours.model.lora_alpha,
        "actor_rollout_ref.model.target_modules": ours.model.lora_target_modules,
        "data.train_files": data_files["train"],
        "data.val_files": data_files["val"],
        "data.train_batch_size": data.train_batch_size,
        "data.seed": ours.seed,
        # the whole multi-turn tail after the prompt (generated + tool tokens) is verl's "response"
        "data.max_response_length": roll.max_total_tokens,
        # rollout
        "actor_rollout_ref.rollout.n": roll.n,
        "actor_rollout_ref.rollout.temperature": roll.temperature,
        "actor_rollout_ref.rollout.top_p": roll.top_p,
        "actor_rollout_ref.rollout.val_kwargs.temperature": roll.val_temperature,
        "actor_rollout_ref.rollout.val_kwargs.do_sample": roll.val_temperature > 0,
        "actor_rollout_ref.rollout.calculate_log_probs": True,
        "actor_rollout_ref.rollout.agent.default_agent_loop": AGENT_NAME,
        "actor_rollout_ref.rollout.agent.agent_loop_config_path": agent_loop_config_path(),
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": micro,
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": micro,
        # advantage estimator (ours are registered under the same names; grpo, rloo, gae are verl's own)
        "algorithm.adv_estimator": alg.advantage,
        "algorithm.norm_adv_by_std_in_grpo": bool(opts.get("norm_by_std", True)),
        "algorithm.gamma": float(opts.get("gamma", 1.0)),
        "algorithm.lam": float(opts.get("lam", 1.0)),
        # policy loss, KL
        "actor_rollout_ref.actor.policy_loss.loss_mode": alg.policy_loss,
        "actor_rollout_ref.actor.clip_ratio_low": alg.clip_ratio_low,
        "actor_rollout_ref.actor.clip_ratio_high": alg.clip_ratio_high,
        "actor_rollout_ref.actor.loss_agg_mode": AGG_NAMES[alg.loss_agg],
        "actor_rollout_ref.actor.use_kl_loss": alg.kl_coef > 0,
        "actor_rollout_ref.actor.kl_loss_coef": alg.kl_coef,
        "actor_rollout_ref.actor.kl_loss_type": alg.kl_kind,
        # optimizer and batching (verl's mini-batch is counted in prompts, like our train_batch_size)
        "actor_rollout_ref.actor.optim.lr": optim.lr,
        "actor_rollout_ref.actor.optim.weight_decay": optim.weight_decay,
        "actor_rollout_ref.actor.optim.lr_warmup_steps": optim.warmup_steps,
        "actor_rollout_ref.actor.optim.clip_grad": optim.grad_clip,
        "actor_rollout_ref.actor.grad_clip": optim.grad_clip,
        "actor_rollout_ref.actor.ppo_epochs": optim.ppo_epochs,
        "actor_rollout_ref.actor.ppo_mini_batch_size": max(1, data.train_batch_size // optim.mini_batches),
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": micro,
        # critic (only built by verl for gae)
        "critic.optim.lr": alg.critic.lr,
        "critic.cliprange_value": alg.critic.cliprange_value,
        "critic.ppo_micro_batch_size_per_gpu": micro,
        # reward: ours, called by verl's reward workers
        "reward.custom_reward_function.path": REWARD_FN_PATH,
        "reward.custom_reward_function.name": "compute_score",
        "reward.custom_reward_function.reward_kwargs": {"rl_factory": {  # the reward worker parses these
            "reward": ours.composed["reward"], "tools": ours.composed["env"]["tools"], "output_dir": str(out_dir)}},
        # trainer and run directory
        "trainer.experiment_name": ours.experiment_name,
        "trainer.total_training_steps": t.total_steps,
        "trainer.test_freq": t.eval_every or t.total_steps,
        "trainer.save_freq": t.save_every or t.total_steps,
        "trainer.default_local_dir": str(out_dir / "checkpoints"),
        "trainer.max_actor_ckpt_to_keep": t.keep_checkpoints,
        "trainer.max_critic_ckpt_to_keep": t.keep_checkpoints,
        "trainer.logger": [LOGGERS[name] for name in t.logger],
        "trainer.rollout_data_dir": str(out_dir / "rollouts_verl") if t.save_rollouts else None,
        "trainer.validation_data_dir": str(out_dir / "rollouts_verl" / "val") if t.save_rollouts else None,
        **_resume(t.resume),
        **pipeline_values(ours),  # rollout filters / dynamic sampling (pipeline.py); may set adv_estimator
        **async_values(ours),  # trainer.max_staleness, algorithm.correction (asynchrony.py)
    }
    env_vars = {"TENSORBOARD_DIR": str(out_dir / "tensorboard")}
    values.update(receipt_values(ours, out_dir, env_vars))
    extra_opts = {k: v for k, v in opts.items() if k not in VERL_OPTIONS}
    if extra_opts:
        env_vars[OPTIONS_ENV] = json.dumps(extra_opts)
    for name, value in env_vars.items():  # Ray's runtime_env carries them to every node's workers
        values[f"{ENV_VARS}.{name}"] = value
    return values


# verl's colocated vLLM worker extension plus the run guard's weight-sync receipts (vllm_receipts.py)
RECEIPTS_EXTENSION = "rl_factory.backends.verl.vllm_receipts.ReceiptsWorkerExtension"


def receipt_values(ours: RunConfig, out_dir: Path, env_vars: dict[str, str]) -> dict[str, Any]:
    """With the guard's receipts on, vLLM's workers fingerprint their weights around every sync: our worker
    extension in place of verl's (a key given on the command line wins), writing into <run>/engine_syncs."""
    from rl_factory.guard import guard_config
    from rl_factory.guard.syncs import SYNCS_DIR, SYNCS_ENV

    guard = guard_config(ours)
    if not guard.enabled or guard.receipts.action == "off":
        return {}
    env_vars[SYNCS_ENV] = str(out_dir / SYNCS_DIR)
    return {"actor_rollout_ref.rollout.engine_kwargs.vllm.worker_extension_cls": RECEIPTS_EXTENSION}


def _resume(resume: str) -> dict[str, Any]:
    if resume in ("auto", "force"):  # force: RunDir.claim let a changed config continue the directory's run
        return {"trainer.resume_mode": "auto"}
    if resume in ("never", "false", "False", None):
        return {"trainer.resume_mode": "disable"}
    return {"trainer.resume_mode": "resume_path", "trainer.resume_from_path": resume}


def compose_verl(ours: RunConfig, raw_overrides: list[str], data_files: dict[str, str],
                 model_path: str) -> DictConfig:
    """verl's full config: configs/verl.yaml + raw verl overrides + our mapped values + `rl_factory`."""
    from hydra import compose, initialize_config_dir
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    parsed = OverridesParser.create().parse_overrides(list(raw_overrides))
    try:
        base = verl_defaults()  # the checks of the composed config compare against the same one (validate.py)
        _check_keys(base, parsed)
        if raw_overrides:
            with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
                cfg = compose(config_name="verl", overrides=list(raw_overrides))
        else:
            cfg = copy.deepcopy(base)
    except (HydraException, OmegaConfBaseException) as exc:
        raise ConfigError(_short(str(exc))) from None
    given = {o.key_or_group for o in parsed}
    for key, value in verl_values(ours, data_files, model_path).items():
        if key not in given:  # a verl key set on the command line wins over the mapping
            OmegaConf.update(cfg, key, value, merge=False, force_add=True)
    for key, value in sampler_values(cfg, given).items():  # verl's replay buffer, polling every 50 ms
        OmegaConf.update(cfg, key, value, merge=False, force_add=True)
    tuned = performance_plan(cfg, model_path, given, trajectory_tokens=ours.rollout.max_total_tokens)
    for key, value in tuned.values.items():
        if not _given(key, given):
            OmegaConf.update(cfg, key, value, merge=False, force_add=True)
    for reason in tuned.reasons:
        if not _given(reason.split("=", 1)[0], given):
            log.info("verl tuning: %s", reason)
    fetch.mode(cfg)  # a bad worker_fetch stops here, before Ray starts (and under --cfg job)
    actor_cache.mode(cfg)  # and a bad actor_cache_at_sync
    # after the mapping and the raw keys: the mode depends on the final epochs and mini-batch size
    log.info("verl: %s", old_log_probs.apply(cfg, ours.algorithm.old_log_probs, given))
    # after the mode: what trains on vLLM's sampling log-probs decides which rollouts ask for them
    log.info("verl: %s", sampling_logprobs.apply(cfg, old_log_probs.resolved(cfg)))
    if cfg.actor_rollout_ref.model.override_config.get("attn_implementation") == "rl_factory_varlen":
        _add_external_lib(cfg, "actor_rollout_ref.model", given)
        if _critic(cfg):
            _add_external_lib(cfg, "critic.model", given)
    _env_vars_as_text(cfg)
    with open_dict(cfg):  # our whole config as given, for the workers (each parses it once)
        cfg.rl_factory = OmegaConf.create(ours.composed)
    return cfg


def _env_vars_as_text(cfg: DictConfig) -> None:
    """Ray's runtime env takes text only, and Hydra reads `env_vars.VLLM_GC_DEBUG=1` as a number: a number or a
    boolean becomes the text it was written as (true/false in lower case), null drops the variable, and anything
    else (a list, a mapping) is refused here by name, not by Ray once the launch is under way."""
    env = OmegaConf.select(cfg, ENV_VARS)
    if env is None:
        return
    with open_dict(env):
        for name in list(env.keys()):
            value = env[name]
            if value is None:
                del env[name]
            elif isinstance(value, bool):
                env[name] = str(value).lower()
            elif isinstance(value, (int, float)):
                env[name] = str(value)
            elif not isinstance(value, str):
                raise ConfigError(f"{ENV_VARS}.{name}: an environment variable's value is text, not "
                                  f"{OmegaConf.to_container(value)!r}")


def _given(key: str, given: set[str]) -> bool:
    """Whether the command line set `key`, a key inside it (`compilation_config.mode` for `compilation_config`) or
    a node holding it (`engine_kwargs.vllm={...}`): a tuned value never overwrites any of them."""
    return any(g == key or g.startswith(key + ".") or key.startswith(g + ".") for g in given)


VARLEN_MODULE = "rl_factory.models.varlen_attention"
SLEEP_KEY = "actor_rollout_ref.rollout.free_cache_engine"
SHARE_KEY = "actor_rollout_ref.rollout.gpu_memory_utilization"
KV_CACHE_KEY = "actor_rollout_ref.rollout.engine_kwargs.vllm.kv_cache_memory_bytes"


def _storage_units(cfg: DictConfig) -> int:
    """TransferQueue's SimpleStorage units as configured; 0 with another storage backend."""
    backend = OmegaConf.select(cfg, "transfer_queue.backend.storage_backend")
    units = OmegaConf.select(cfg, "transfer_queue.backend.SimpleStorage.num_data_storage_units")
    return int(units or 0) if backend == "SimpleStorage" else 0


def _add_external_lib(cfg: DictConfig, prefix: str, given: set[str]) -> None:
    """verl imports `<model>.external_lib` in every worker before building the model: our attention registers there."""
    key = f"{prefix}.external_lib"
    current = OmegaConf.select(cfg, key)
    libs = [] if current is None else list(current) if not isinstance(current, str) else [current]
    if VARLEN_MODULE not in libs:
        OmegaConf.update(cfg, key, [VARLEN_MODULE, *libs], merge=False, force_add=True)


def performance_plan(cfg: DictConfig, model_path: str, given: set[str] = frozenset(),
                     trajectory_tokens: int | None = None) -> Plan:
    """The tuned settings for this model and GPU (rl_factory/backends/verl/tuning.py); `given`: the keys set on
    the command line (a given free_cache_engine decides whether vLLM sleeps, and the budgets follow it);
    `trajectory_tokens`: our rollout's cap on a whole trajectory (`rollout.max_total_tokens`)."""
    shape = None if model_path.startswith("builtin:") else ModelShape.from_path(model_path)
    total, _measured = gpu_bytes()
    try:
        return plan(shape, gpus=int(cfg.trainer.n_gpus_per_node) * int(cfg.trainer.nnodes), gpu_total=total,
                    longest_sequence=int(cfg.data.max_prompt_length) + int(cfg.data.max_response_length),
                    trajectory_tokens=trajectory_length(cfg, trajectory_tokens),
                    lora=int(cfg.actor_rollout_ref.model.lora_rank) > 0, critic=_critic(cfg),
                    concurrency=_rollout_concurrency(cfg), max_num_seqs=int(cfg.actor_rollout_ref.rollout.max_num_seqs),
                    max_num_batched_tokens=int(cfg.actor_rollout_ref.rollout.max_num_batched_tokens),
                    vllm_request_tokens=int(cfg.data.max_response_length) if cfg.actor_rollout_ref.rollout.name == "vllm"
                    else 0, replica_gpus=replica_gpus(cfg), nodes=int(cfg.trainer.nnodes),
                    storage_units=_storage_units(cfg),
                    free_cache_engine=bool(OmegaConf.select(cfg, SLEEP_KEY)) if SLEEP_KEY in given else None,
                    offload=_offload(cfg, "actor_rollout_ref.actor.fsdp_config"),
                    critic_offload=_offload(cfg, "critic.fsdp"),
                    optimizers={prefix: _optimizer(cfg, prefix) for prefix in ("actor_rollout_ref.actor", "critic")},
                    # vLLM's memory given on the command line: the trainer is planned beside it
                    **_vllm_memory_given(cfg, given))
    except ModelDoesNotFit as exc:
        raise ConfigError(str(exc)) from None


def _optimizer(cfg: DictConfig, prefix: str) -> str:
    """The optimizer class verl's `build_optimizer` imports for `prefix` (`torch.optim.AdamW` by default)."""
    impl = OmegaConf.select(cfg, f"{prefix}.optim.optimizer_impl") or "torch.optim"
    return f"{impl}.{OmegaConf.select(cfg, f'{prefix}.optim.optimizer') or 'AdamW'}"


def trajectory_length(cfg: DictConfig, trajectory_tokens: int | None) -> int | None:
    """The most tokens one trajectory holds in vLLM's KV cache, where our agent loop runs the rollout: it ends a
    trajectory at `rollout.max_total_tokens`, prompt included (rl_factory/context.py), so the 0.6B shape's are 512
    tokens, not verl's padded 1536. None under verl's own agent loops, held to verl's lengths only. (The trainer's
    micro-batches still hold verl's padded length: verl's micro-batching asserts it.)"""
    ours = OmegaConf.select(cfg, "actor_rollout_ref.rollout.agent.default_agent_loop") == AGENT_NAME
    return int(trajectory_tokens) if ours and trajectory_tokens else None


def _vllm_memory_given(cfg: DictConfig, given: set[str]) -> dict[str, Any]:
    """The plan's `share_given`, `kv_cache_given` and `kv_cache_bytes`: the command line's values, where they are
    ones vLLM takes (check_verl_config refuses the others in one line, after the plan)."""
    def usable(key: str) -> bool:
        return _given(key, given) and VERL_VALUE_RULES[key].allows(OmegaConf.select(cfg, key))

    share, kv = usable(SHARE_KEY), usable(KV_CACHE_KEY)
    return {"share_given": float(OmegaConf.select(cfg, SHARE_KEY)) if share else None,
            "kv_cache_given": kv, "kv_cache_bytes": OmegaConf.select(cfg, KV_CACHE_KEY) if kv else None}


def _offload(cfg: DictConfig, fsdp_config: str) -> Offload:
    """A model's CPU offload outside its update, from verl's `fsdp_config` at that key."""
    return Offload(params=bool(OmegaConf.select(cfg, f"{fsdp_config}.param_offload")),
                   optimizer=bool(OmegaConf.select(cfg, f"{fsdp_config}.optimizer_offload")))


def _critic(cfg: DictConfig) -> bool:
    """Whether verl builds a critic model for this config (its own predicate: the estimator verl runs needs one)."""
    import warnings

    from verl.trainer.ppo.utils import need_critic

    with warnings.catch_warnings():  # it warns whenever the answer is no
        warnings.simplefilter("ignore")
        return need_critic(cfg)


def replica_gpus(cfg: DictConfig) -> int:
    """GPUs of one vLLM replica: tensor x data x pipeline parallel, as verl's RolloutReplica counts it."""
    rollout = cfg.actor_rollout_ref.rollout
    size = 1
    for key in ("tensor_model_parallel_size", "data_parallel_size", "pipeline_model_parallel_size"):
        size *= max(1, int(rollout.get(key, 1) or 1))
    return size


def rollout_replicas(cfg: DictConfig) -> int:
    """vLLM replicas verl starts: the GPUs over one replica's size, e.g. 2 GPUs: 2 replicas at tensor parallel 1,
    1 at 2."""
    return max(1, int(cfg.trainer.n_gpus_per_node) * int(cfg.trainer.nnodes) // replica_gpus(cfg))


def _rollout_concurrency(cfg: DictConfig) -> int:
    """Trajectories one vLLM replica may decode at once: a step's prompts x n over the replicas (verl's load
    balancer spreads the requests evenly), times the batches in flight under an async trainer: sized for one
    batch, a k=1 run of the 0.6B shape decoded 256 trajectories at once with CUDA graphs captured only up to
    128 (H200, 2026-12-05: 8 s a rollout of two batches, against 2.9 s for one batch in a sync run)."""
    rollout = cfg.actor_rollout_ref.rollout
    per_batch = -(-int(cfg.data.train_batch_size) * int(rollout.n) // rollout_replicas(cfg))
    return math.ceil(per_batch * batches_in_flight(cfg))


def _check_keys(base: DictConfig, parsed: list[Any]) -> None:
    """A raw override must name a verl key (or add one with +): 'did you mean' for the rest."""
    for override in parsed:
        key = override.key_or_group
        if override.is_add() or _has_key(base, key):
            continue
        parent, _, leaf = key.rpartition(".")
        node = OmegaConf.select(base, parent) if parent else base
        hint = closest_key_hint(leaf, node.keys(), parent) if isinstance(node, DictConfig) else ""
        raise ConfigError(f"unknown config key {key}: neither an rl_factory key (configs/grpo.yaml) nor a verl "
                          f"key{hint}; to add a new key use +{key}=...")

