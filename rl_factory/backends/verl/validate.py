"""Every check verl makes of its config, run on the driver before Ray starts: `check_verl_config(cfg)`.

verl checks its config in four places, the last three minutes into a run:

- `validate_config` on the driver (verl.trainer.main_ppo.main);
- the dataclass conversions in its Ray workers (`omega_conf_to_dataclass` of the rollout slice in every
  AgentLoopWorker and FSDP worker, of the reference slice, of the distillation slice), where a bad value
  stops a worker;
- assertions in those workers: a vLLM replica's GPUs divide the GPUs, the log-prob batching matches the
  actor's, and a mini-batch splits over the data-parallel ranks (at the first update, after a rollout);
- nowhere, for a key verl never reads: `+actor_rollout_ref.rollout.gpu_memory_utilisation=0.5` is
  composed, printed and ignored;
- nowhere, for most numbers: `actor_rollout_ref.rollout.gpu_memory_utilization=1.5` reaches vLLM, which
  refuses it when its server starts, and `actor_rollout_ref.actor.ppo_epochs=0` trains nothing, silently.
  `VERL_VALUE_RULES` gives the numbers users set on verl their ranges, as rl_factory/config_rules.py does ours.

`--cfg job`, `--doctor` and the launcher (launcher.run) call this one function, so each of these errors
costs seconds. Each is a ConfigError of one line that names the key.

What needs the machine and is not checked here: that it has the GPUs `trainer.n_gpus_per_node` names
(launcher.check_gpus, at launch; the doctor warns), the model's own config (verl's HFModelConfig reads
the model's files: a critic's is converted here only when its model is a local directory), and what vLLM
makes of its memory share and engine arguments.
"""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import io
import logging
import re
from functools import lru_cache
from pathlib import Path

from omegaconf import DictConfig, OmegaConf, open_dict

from rl_factory.config import CONFIG_DIR, ConfigError, closest_key_hint
from rl_factory.config_rules import Range, at_least, check_values, positive

log = logging.getLogger("rl_factory.verl")

# The slices verl turns into dataclasses (hydra.utils.instantiate of their `_target_`, recursively): a key
# there that is not a field of its dataclass fails that conversion.
CONVERTED = ("actor_rollout_ref.actor", "actor_rollout_ref.rollout", "actor_rollout_ref.ref",
             "actor_rollout_ref.model", "critic", "distillation")
# verl's numbers that a user sets (ours map onto most of them, already checked; a raw key given wins) and
# what verl, vLLM and the run can work with. A key the composed config lacks is not checked.
_ROLLOUT, _ACTOR = "actor_rollout_ref.rollout.", "actor_rollout_ref.actor."
VERL_VALUE_RULES = {
    "data.train_batch_size": at_least(1), "data.max_prompt_length": at_least(1),
    "data.max_response_length": at_least(1),
    "trainer.n_gpus_per_node": at_least(1), "trainer.nnodes": at_least(1), "trainer.total_epochs": at_least(1),
    "trainer.total_training_steps": at_least(1, nullable=True), "reward.num_workers": at_least(1),
    _ROLLOUT + "n": at_least(1), _ROLLOUT + "gpu_memory_utilization": Range(float, 0, 1, open_low=True),
    _ROLLOUT + "temperature": at_least(0, float), _ROLLOUT + "top_p": Range(float, 0, 1, open_low=True),
    _ROLLOUT + "top_k": at_least(-1),  # -1 (or 0): no top-k
    _ROLLOUT + "max_num_seqs": at_least(1), _ROLLOUT + "max_num_batched_tokens": at_least(1),
    _ROLLOUT + "tensor_model_parallel_size": at_least(1), _ROLLOUT + "data_parallel_size": at_least(1),
    _ROLLOUT + "agent.num_workers": at_least(1), _ROLLOUT + "max_model_len": at_least(1, nullable=True),
    _ROLLOUT + "checkpoint_engine.update_weights_bucket_megabytes": at_least(1),
    # verl hands engine_kwargs to vLLM's engine arguments as they are: bytes as a whole number ("16G" is parsed on
    # vLLM's command line only)
    _ROLLOUT + "engine_kwargs.vllm.kv_cache_memory_bytes": at_least(1, nullable=True),
    _ROLLOUT + "val_kwargs.n": at_least(1), _ROLLOUT + "val_kwargs.temperature": at_least(0, float),
    _ROLLOUT + "val_kwargs.top_p": Range(float, 0, 1, open_low=True),
    _ACTOR + "ppo_epochs": at_least(1), _ACTOR + "ppo_mini_batch_size": at_least(1),
    _ACTOR + "ppo_max_token_len_per_gpu": at_least(1), _ACTOR + "optim.lr": at_least(0, float),
    _ACTOR + "optim.weight_decay": at_least(0, float), _ACTOR + "optim.lr_warmup_steps": at_least(-1),
    _ACTOR + "grad_clip": positive(), _ACTOR + "clip_ratio": at_least(0, float),
    _ACTOR + "clip_ratio_low": at_least(0, float), _ACTOR + "clip_ratio_high": at_least(0, float),
    _ACTOR + "kl_loss_coef": at_least(0, float),
}
# verl's messages that name no full key -> the keys they are about.
# nodes verl passes as keyword arguments to a function: their keys are its parameters (run_ppo: ray.init(**ray_init))
KWARGS_OF = {"ray_kwargs.ray_init": "ray.init"}
MESSAGE_KEYS = (
    ("real_train_batch_size", "data.train_batch_size x actor_rollout_ref.rollout.n (rollout.n) over "
                              "trainer.n_gpus_per_node x trainer.nnodes"),
    ("actor.ppo_mini_batch_size",
     "actor_rollout_ref.actor.ppo_mini_batch_size (data.train_batch_size / optim.mini_batches)"),
    ("critic.ppo_mini_batch_size", "critic.ppo_mini_batch_size"),
    ("[critic]", "critic.ppo_micro_batch_size_per_gpu"),
    ("validation gen temperature", "actor_rollout_ref.rollout.temperature (rollout.temperature) with "
                                   "actor_rollout_ref.rollout.val_kwargs.do_sample (rollout.val_temperature > 0)"),
    ("loss_agg_mode", "actor_rollout_ref.actor.loss_agg_mode (algorithm.loss_agg)"),
    ("model_parallel_size", "actor_rollout_ref.actor.megatron.tensor_model_parallel_size"),
    ("ppo_micro_batch_size", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"),
    ("router_replay", "actor_rollout_ref.actor.*.router_replay.mode"),
    ("lora", "actor_rollout_ref.model.lora_rank"),
)


def check_verl_config(cfg: DictConfig) -> None:
    """Raise ConfigError for anything verl would refuse in `cfg`, on the driver or later in its workers."""
    import warnings

    from verl.trainer.ppo.utils import need_critic, need_reference_policy

    check_keys(cfg)
    check_values(cfg, VERL_VALUE_RULES)
    cfg = _checkable(cfg)
    with warnings.catch_warnings():  # need_critic warns whenever the answer is no
        warnings.simplefilter("ignore")
        reference, critic = need_reference_policy(cfg), need_critic(cfg)
    _validate_config(cfg, reference, critic)
    actor = _convert(cfg, reference)
    _worker_assertions(cfg, actor, critic)
    _worker_extension(cfg)


def check_keys(cfg: DictConfig) -> None:
    """Every key of `cfg` outside `rl_factory` is in verl's schema (configs/verl.yaml), a field of the
    dataclass verl converts its slice to, under a free-form node (an empty one: engine_kwargs, env_vars),
    or at least a name verl's code reads; else the first one found is named with the closest known key."""
    for path, parent in _added(cfg, verl_defaults(), ""):
        where, _, leaf = path.rpartition(".")
        target = parent.get("_target_") if _converted(where) else KWARGS_OF.get(where)
        fields = (_parameters(target) if where in KWARGS_OF else _fields(target)) if target else None
        if fields is not None and leaf in fields or fields is None and leaf in _verl_names():
            continue
        known = sorted({str(k) for k in parent.keys() if not str(k).startswith("_")} | (fields or set()))
        hint = closest_key_hint(leaf, known, where)
        why = (f"{target} has no such parameter: verl passes {where} to it" if where in KWARGS_OF else
               f"verl's {target.rsplit('.', 1)[-1]} has no such field, and its Ray workers would fail on it "
               "minutes into the run" if fields is not None else "verl never reads it: it would be ignored")
        raise ConfigError(f"unknown verl key {path}{hint}: {why}")


def _added(node: DictConfig, base: DictConfig, prefix: str):
    """(path, the schema node above it) of every key of `node` that `base` lacks; our `rl_factory` and
    free-form nodes (empty in the schema) are left alone."""
    for key in node.keys():
        path = f"{prefix}.{key}" if prefix else str(key)
        if path == "rl_factory":
            continue
        if key not in base:
            yield path, base
            continue
        child, known = node._get_node(key), base._get_node(key)
        if (isinstance(child, DictConfig) and isinstance(known, DictConfig) and not child._is_none()
                and not known._is_none() and len(known)):
            yield from _added(child, known, path)


def _converted(path: str) -> bool:
    return any(path == s or path.startswith(s + ".") for s in CONVERTED)


@lru_cache(maxsize=None)
def verl_defaults() -> DictConfig:
    """configs/verl.yaml as composed without overrides: verl's ppo_trainer and our defaults. Composed once a process
    (a Hydra compose of verl's tree takes most of a second); read-only: copy it before changing it."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        return compose(config_name="verl")


@lru_cache(maxsize=None)
def _parameters(function: str) -> set[str]:
    """The keyword parameters of `function` ("module.name")."""
    import importlib
    import inspect

    module, _, name = function.rpartition(".")
    return set(inspect.signature(getattr(importlib.import_module(module), name)).parameters) - {"kwargs"}


@lru_cache(maxsize=None)
def _fields(target: str) -> set[str] | None:
    from hydra.utils import get_class

    try:
        cls = get_class(target)
    except Exception:  # noqa: BLE001 - an unknown _target_ fails in the conversion, with hydra's message
        return None
    return {f.name for f in dataclasses.fields(cls) if f.init} if dataclasses.is_dataclass(cls) else None


@lru_cache(maxsize=None)
def _verl_names() -> frozenset[str]:
    """Every identifier in verl's code and config files: a key named by none of them is read by none."""
    import verl

    names: set[str] = set()
    for path in Path(verl.__file__).parent.rglob("*"):
        if path.suffix in (".py", ".yaml"):
            names.update(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", path.read_text(errors="ignore")))
    return frozenset(names)


def _checkable(cfg: DictConfig) -> DictConfig:
    """A copy to check (the reference slice is rewritten as verl's worker does). A critic's model is
    converted only from a local directory: verl's HFModelConfig reads its files, and a hub id would be
    downloaded (or a `builtin:` model built) just to check the config."""
    cfg = copy.deepcopy(cfg)
    path = OmegaConf.select(cfg, "critic.model.path")
    if path is not None and not Path(str(path)).is_dir():
        with open_dict(cfg):
            cfg.critic.model = None
    return cfg


def _validate_config(cfg: DictConfig, reference: bool, critic: bool) -> None:
    """verl's validate_config, its prints (a notice, a deprecation) as log lines, not on stdout (where
    `--cfg job` prints the config)."""
    from verl.utils.config import validate_config

    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed):
            validate_config(config=cfg, use_reference_policy=reference, use_critic=critic)
    except Exception as exc:  # noqa: BLE001 - AssertionError, ValueError, a conversion's error: all are config errors
        raise ConfigError(verl_line(exc)) from None
    finally:
        for line in printed.getvalue().splitlines():
            if line.strip() and "checks passed" not in line:
                log.warning("verl: %s", line.strip())


def _convert(cfg: DictConfig, reference: bool):
    """The slices verl's workers convert, converted now (returns the actor's dataclass)."""
    from verl.trainer.distillation.losses import is_distillation_enabled
    from verl.utils.config import omega_conf_to_dataclass

    arr = cfg.actor_rollout_ref
    slices = {"actor_rollout_ref.actor": arr.actor, "actor_rollout_ref.rollout": arr.rollout}
    if reference:
        slices["actor_rollout_ref.ref"] = _reference(cfg)
    if is_distillation_enabled(cfg.get("distillation")):
        slices["distillation"] = cfg.distillation
    converted = {}
    for path, node in slices.items():
        try:
            converted[path] = omega_conf_to_dataclass(node)
        except Exception as exc:  # noqa: BLE001 - whatever the dataclass raises is the worker's error
            raise ConfigError(verl_line(exc, path)) from None
    return converted["actor_rollout_ref.actor"]


def _reference(cfg: DictConfig) -> DictConfig:
    """The reference slice as verl's engine worker rewrites it before converting (engine_workers.py init_model)."""
    ref = OmegaConf.create(OmegaConf.to_container(cfg.actor_rollout_ref.ref, resolve=True))
    with open_dict(ref):
        ref.ppo_mini_batch_size = cfg.actor_rollout_ref.actor.ppo_mini_batch_size
        ref.ppo_micro_batch_size = ref.pop("log_prob_micro_batch_size", None)
        ref.ppo_micro_batch_size_per_gpu = ref.pop("log_prob_micro_batch_size_per_gpu", None)
        ref.use_dynamic_bsz = ref.pop("log_prob_use_dynamic_bsz", False)
        ref.ppo_max_token_len_per_gpu = ref.pop("log_prob_max_token_len_per_gpu", None)
    return ref


def _worker_assertions(cfg: DictConfig, actor, critic: bool) -> None:
    """What verl's workers assert at start-up and at the first update (engine_workers.py, llm_server.py)."""
    rollout, actor_cfg = cfg.actor_rollout_ref.rollout, cfg.actor_rollout_ref.actor
    gpus = int(cfg.trainer.n_gpus_per_node) * int(cfg.trainer.nnodes)
    sizes = {k: int(rollout.get(k) or 1) for k in
             ("tensor_model_parallel_size", "data_parallel_size", "pipeline_model_parallel_size")}
    replica = sizes["tensor_model_parallel_size"] * sizes["data_parallel_size"] * sizes["pipeline_model_parallel_size"]
    if gpus % replica:
        parts = " x ".join(f"{k}={v}" for k, v in sizes.items() if v > 1 or k == "tensor_model_parallel_size")
        raise ConfigError(f"actor_rollout_ref.rollout.{parts}: one vLLM replica takes {replica} GPU(s), which must "
                          f"divide the {gpus} of trainer.n_gpus_per_node x trainer.nnodes (verl would start "
                          f"{gpus // replica} replica(s) and its workers assert on it)")
    if bool(actor_cfg.use_dynamic_bsz) != bool(rollout.log_prob_use_dynamic_bsz):
        raise ConfigError(f"actor_rollout_ref.actor.use_dynamic_bsz={actor_cfg.use_dynamic_bsz} but "
                          f"actor_rollout_ref.rollout.log_prob_use_dynamic_bsz={rollout.log_prob_use_dynamic_bsz}: "
                          "verl's actor worker asserts they are equal; set both")
    per_gpu = ("max_token_len_per_gpu", "ppo_max_token_len_per_gpu") if actor_cfg.use_dynamic_bsz else \
        ("micro_batch_size_per_gpu", "ppo_micro_batch_size_per_gpu")
    for key in (f"actor_rollout_ref.rollout.log_prob_{per_gpu[0]}", f"actor_rollout_ref.actor.{per_gpu[1]}"):
        if OmegaConf.select(cfg, key) is None:
            raise ConfigError(f"{key} is null: verl's actor worker asserts it is set "
                              f"(actor_rollout_ref.actor.use_dynamic_bsz={actor_cfg.use_dynamic_bsz})")
    updates = [("actor_rollout_ref.actor", actor_cfg, actor)] + ([("critic", cfg.critic, None)] if critic else [])
    for prefix, node, converted in updates:
        ranks = gpus // _model_parallel(node, converted)
        mini = int(node.ppo_mini_batch_size) * int(rollout.n)
        if ranks and mini % ranks:
            raise ConfigError(f"{prefix}.ppo_mini_batch_size={node.ppo_mini_batch_size} x actor_rollout_ref.rollout.n="
                              f"{rollout.n} = {mini} trajectories per update must split evenly over {ranks} "
                              f"data-parallel rank(s) ({gpus} GPUs): verl's workers assert it at the first update, "
                              "after the first rollout (ours: data.train_batch_size / optim.mini_batches prompts)")


def _worker_extension(cfg: DictConfig) -> None:
    """vLLM imports `engine_kwargs.vllm.worker_extension_cls` in each worker it starts, minutes into the run: its
    module must be on this machine. Found, not imported (ours and verl's import vLLM, which the driver may lack)."""
    import importlib.util

    key = "actor_rollout_ref.rollout.engine_kwargs.vllm.worker_extension_cls"
    name = OmegaConf.select(cfg, key)
    if not name:
        return
    module, _, cls = str(name).rpartition(".")
    try:
        found = bool(module) and importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        found = False
    if not found or not cls:
        raise ConfigError(f"{key}={name}: no module {module or name!r} on this machine (a `module.Class` name): "
                          "vLLM's workers would fail to start with it minutes into the run")


def _model_parallel(node: DictConfig, converted) -> int:
    """GPUs that hold one copy of the model in training: megatron's tensor x pipeline x context parallel
    sizes, FSDP's Ulysses sequence-parallel size."""
    if node.strategy == "megatron":
        m = node.megatron
        return int(m.tensor_model_parallel_size) * int(m.pipeline_model_parallel_size) * int(m.context_parallel_size)
    engine = getattr(converted, "engine", None)
    size = getattr(engine, "ulysses_sequence_parallel_size", None) or node.get("ulysses_sequence_parallel_size")
    return max(1, int(size or 1))


def verl_line(exc: BaseException, path: str | None = None) -> str:
    """One line for verl's error: the keys it is about, then its own words (a conversion's underlying error,
    without hydra's wrapping)."""
    from hydra.errors import InstantiationException

    inner = exc.__cause__ if isinstance(exc, InstantiationException) and exc.__cause__ is not None else exc
    text = " ".join(str(inner).split()) or type(inner).__name__
    found = re.search(r"full_key: (\S+)", str(exc))
    keys = next((keys for fragment, keys in MESSAGE_KEYS if fragment in text), None)
    about = keys or (found.group(1) if found else path)
    return f"verl rejects {about}: {text}" if about else f"verl rejects the config: {text}"
