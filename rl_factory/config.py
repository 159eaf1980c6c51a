"""Config loading (Hydra compose) and the typed slices each component is built from.

`load_config(name, overrides)` composes `configs/<name>.yaml` with command-line overrides exactly as
`@hydra.main` would (struct mode: a misspelled key is an error), but raises `ConfigError` with a
one-line message instead of printing a stack trace; it also checks every key of `VALUE_RULES` (the
numeric keys' types and ranges, a few keys' fixed choices) so that `trainer.total_steps=-3` is refused
before anything runs or is written.

`parse(cfg)` reads the composed config once, at an entry point (train, eval, rescore, doctor, the verl
launcher and verl's worker processes), into a `RunConfig`: one typed slice per top-level node (`SLICES`:
`.model`, `.data`, `.env`, `.reward`, `.rollout`, `.algorithm`, `.optim`, `.trainer`, `.eval`), each
dataclass naming any key it does not know. Components get their slice, never the Hydra node.
`check_training(run)` holds the checks across slices (estimator, loss, pipeline and the capability table
for `trainer.backend`) in one place. The dataclasses' defaults are the product's: the YAML files carry the
same values, and tests/test_config_defaults.py fails on any drift between them.
"""
from __future__ import annotations

import copy
import dataclasses
import difflib
import importlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from omegaconf import DictConfig, OmegaConf

from rl_factory.base import secrets
from rl_factory.base.errors import ConfigError
from rl_factory.config_rules import VALUE_RULES, OneOf, Range, at_least, check_values, positive  # noqa: F401

if TYPE_CHECKING:
    from rewards.combine import RewardConfig
    from rl_factory.components import DataConfig, EnvConfig, SamplingConfig
    from rl_factory.evaluate_cli import EvalConfig
    from rl_factory.policy import ModelConfig
    from rl_factory.trainer import TrainerConfig
    from rl_factory.update import AlgorithmConfig, OptimConfig

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"
T = TypeVar("T")


def load_config(name: str, overrides: list[str], config_dir: str | Path | None = None) -> DictConfig:
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    config_dir = Path(config_dir or CONFIG_DIR).resolve()
    try:
        with initialize_config_dir(config_dir=str(config_dir), version_base=None):
            cfg = compose(config_name=name, overrides=list(overrides))
        secrets.note_config_secrets(OmegaConf.to_container(cfg, resolve=False))
        _keep_manifest_env_refs(cfg)
        OmegaConf.resolve(cfg)
        _keep_manifest_env_refs(cfg)  # resolving un-escapes them
    except (HydraException, OmegaConfBaseException) as exc:
        raise ConfigError(_explain(str(exc), config_dir, name)) from None
    check_values(cfg)
    return cfg


def _keep_manifest_env_refs(cfg: DictConfig) -> None:
    """An inline manifest keeps `${oc.env:VAR}` as text: the manifest loader resolves it where the tools
    open (and masks it), so no printed or written copy of the config holds the value; `${sample.*}` too."""
    tools = OmegaConf.select(cfg, "env.tools")
    if isinstance(tools, DictConfig):
        cfg.env.tools = keep_episode_refs(secrets.keep_env_refs(OmegaConf.to_container(tools, resolve=False)))


def keep_episode_refs(raw: Any) -> Any:
    """`${sample.col}` / `${episode.dir}` in an inline manifest escaped, so OmegaConf keeps them as text: they
    are filled per episode (envs.templates), not when the config resolves."""
    if isinstance(raw, dict):
        return {k: keep_episode_refs(v) for k, v in raw.items()}
    if isinstance(raw, list):
        return [keep_episode_refs(v) for v in raw]
    if isinstance(raw, str):
        return re.sub(r"(?<!\\)\$\{(sample|episode)\.", r"\\${\1.", raw)
    return raw


def closest_key_hint(leaf: str, known, parent: str = "") -> str:
    """` (did you mean parent.key?)` for the known key closest to a misspelled `leaf`, else "" (every "unknown
    key" error of the configs: ours, verl's overrides, verl's schema)."""
    close = difflib.get_close_matches(leaf, [str(k) for k in known], n=1)
    return f" (did you mean {parent + '.' if parent else ''}{close[0]}?)" if close else ""


def _explain(message: str, config_dir: Path, name: str) -> str:
    """Turn Hydra's 'Could not override' into 'unknown config key a.b (did you mean a.c?)'."""
    match = re.search(r"Could not override '([^']+)'", message)
    if not match:
        return _short(message)
    key = match.group(1)
    parent, _, leaf = key.rpartition(".")
    base = OmegaConf.load(config_dir / f"{name}.yaml")
    node = OmegaConf.select(base, parent) if parent else base
    hint = ""
    if isinstance(node, DictConfig) and len(node) == 0:  # an open mapping such as advantage_options
        return f"{parent} takes free-form options: add {leaf} with +{key}=..."
    target = OmegaConf.select(base, key)
    if isinstance(target, DictConfig) and len(target) == 0:  # a whole mapping given to an open one (extra_body)
        return f"{key} is a free-form mapping: set all of it with ++{key}={{...}}, or one key with +{key}.name=..."
    if isinstance(node, DictConfig):
        hint = closest_key_hint(leaf, node.keys(), parent)
    return f"unknown config key {key}{hint}; to add a new key use +{key}=..."


def _short(message: str) -> str:
    """Hydra's messages carry hints over several lines; keep what names the problem."""
    lines = [line.strip() for line in message.strip().splitlines() if line.strip()]
    keep = [line for line in lines if not line.startswith(("full_key", "object_type", "reference_type"))]
    return " ".join(keep) or message


def plain(node: Any) -> Any:
    """An OmegaConf node (verl hands its config slices on as they are) as plain dicts/lists, resolved;
    anything else as it is."""
    return OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else node


def section(cfg: DictConfig | dict, key: str, cls: type[T], **extra: Any) -> T:
    """Build dataclass `cls` from `cfg[key]`; unknown keys are an error naming `key.<bad>`."""
    node = cfg.get(key) if key else cfg
    values = OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else dict(node or {})
    values.update(extra)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - set(fields))
    if unknown:
        raise ConfigError(f"unknown config key {key}.{unknown[0]} (valid keys: {', '.join(sorted(fields))})")
    from pydantic import TypeAdapter, ValidationError

    try:  # checks each value against the dataclass's type hints ("optim.lr=abc" fails here)
        return TypeAdapter(cls).validate_python(values)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in (key, *err["loc"]) if p != "")
        raise ConfigError(f"{where}: {err['msg']} (got {err.get('input')!r})") from None


def redacted(cfg: DictConfig | dict, resolve: bool = True) -> dict:
    """A plain copy of the config safe to print or write to config.yaml (`rl_factory.base.secrets.redact_config`):
    secret-named values and an inline manifest's `env`/`headers` values masked, a secret that came
    from `${oc.env:VAR}` shown as that reference, wherever it appears."""
    data = OmegaConf.to_container(cfg, resolve=resolve) if isinstance(cfg, DictConfig) else cfg
    if isinstance(cfg, DictConfig) and not resolve:  # show escaped references as they resolve: ${oc.env:VAR}
        data = _unescape_episode_refs(secrets.unescape_env_refs(data))
    return secrets.redact_config(data)


def _unescape_episode_refs(data: Any) -> Any:
    if isinstance(data, dict):
        return {k: _unescape_episode_refs(v) for k, v in data.items()}
    if isinstance(data, list):
        return [_unescape_episode_refs(v) for v in data]
    return re.sub(r"\\\$\{(sample|episode)\.", r"${\1.", data) if isinstance(data, str) else data


def printable(cfg: DictConfig, resolve: bool = False) -> str:
    """`--cfg job` (and `--resolve`): the config as YAML, redacted."""
    import yaml

    return yaml.safe_dump(redacted(cfg, resolve=resolve), sort_keys=False)


def worker_config(cfg: DictConfig) -> DictConfig:
    """A copy of `cfg` to hand to processes that print it (verl's TaskRunner): secrets travel as
    `${oc.env:VAR}` references (see `rl_factory.base.secrets.for_workers`)."""
    return OmegaConf.create(secrets.for_workers(OmegaConf.to_container(cfg, resolve=False)))


def split_overrides(overrides: list[str], name: str = "grpo",
                    config_dir: str | Path | None = None) -> tuple[list[str], list[str]]:
    """Split command-line overrides into ours and the rest (raw keys of a backend such as verl).

    An override is ours when its key exists in `configs/<name>.yaml`, when it adds (`+key=...`) under
    one of our nodes, or when it lies under one of our top-level keys that no backend shares. Anything
    else (`actor_rollout_ref.rollout.tensor_model_parallel_size=2`, `trainer.n_gpus_per_node=8`) is
    passed on to the backend, which rejects what it does not know either.
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser

    config_dir = Path(config_dir or CONFIG_DIR).resolve()
    base = OmegaConf.load(config_dir / f"{name}.yaml")
    ours_only = {str(k) for k in base.keys()} - SHARED_TOP_LEVEL
    try:
        parsed = OverridesParser.create().parse_overrides(list(overrides))
    except Exception as exc:  # hydra's OverrideParseException: a malformed key=value
        raise ConfigError(_short(str(exc))) from None
    ours, theirs = [], []
    for text, override in zip(overrides, parsed):
        key = override.key_or_group
        parent = key.rpartition(".")[0]
        mine = (_has_key(base, key) or key.split(".")[0] in ours_only
                or (override.is_add() and parent and _has_key(base, parent)))
        (ours if mine else theirs).append(text)
    return ours, theirs


# Top-level nodes both we and verl have; a key under them is ours only if our config has it.
SHARED_TOP_LEVEL = {"data", "reward", "algorithm", "trainer"}


def _has_key(cfg: DictConfig, dotted: str) -> bool:
    node: Any = cfg
    for part in dotted.split("."):
        if not isinstance(node, DictConfig) or part not in node:
            return False
        node = node[part]
    return True


# ---- the typed config: one dataclass per top-level node, parsed once at each entry point --------------

# Top-level node -> "module:Class" of its slice (imported when a config is parsed: the classes live beside
# the code that uses them). `eval` is configs/eval.yaml's own node.
SLICES: dict[str, str] = {
    "model": "rl_factory.policy:ModelConfig",
    "data": "rl_factory.components:DataConfig",
    "env": "rl_factory.components:EnvConfig",
    "reward": "rewards.combine:RewardConfig",
    "rollout": "rl_factory.components:SamplingConfig",
    "algorithm": "rl_factory.update:AlgorithmConfig",
    "optim": "rl_factory.update:OptimConfig",
    "trainer": "rl_factory.trainer:TrainerConfig",
    "eval": "rl_factory.evaluate_cli:EvalConfig",
}


def slice_class(key: str) -> type:
    """The dataclass of top-level node `key` (`SLICES`)."""
    module, _, name = SLICES[key].partition(":")
    return getattr(importlib.import_module(module), name)


def _default(key: str) -> Any:
    return field(default_factory=lambda: slice_class(key)())


@dataclass
class RunConfig:
    """The whole config as typed slices; `RunConfig()` is the default job's (configs/grpo.yaml).

    `composed` is the composed config as plain data (resolved), for what records the config as given:
    config.yaml and run.json, and the copy verl's workers receive (they parse it again, once per process).
    It is {} for a RunConfig built in code. Components read their slice, not `composed`.
    """

    experiment_name: str = "calculator_grpo"
    seed: int = 0
    model: ModelConfig = _default("model")
    data: DataConfig = _default("data")
    env: EnvConfig = _default("env")
    reward: RewardConfig = _default("reward")
    rollout: SamplingConfig = _default("rollout")
    algorithm: AlgorithmConfig = _default("algorithm")
    optim: OptimConfig = _default("optim")
    trainer: TrainerConfig = _default("trainer")
    eval: EvalConfig = _default("eval")  # configs/eval.yaml's node (its defaults where a config has none)
    composed: dict[str, Any] = field(default_factory=dict, repr=False)

    def with_values(self, values: Mapping[str, Any]) -> RunConfig:
        """A copy with dotted keys set in the slices and in `composed` alike (a path made absolute, the
        checkpoint an evaluation picked), so what runs and what is recorded stay one config."""
        new = copy.deepcopy(self)
        for key, value in values.items():
            *parents, leaf = key.split(".")
            node, data = new, new.composed
            for part in parents:
                node, data = getattr(node, part), data.setdefault(part, {})
            setattr(node, leaf, copy.deepcopy(value))
            data[leaf] = copy.deepcopy(value)
        return new


def parse(cfg: DictConfig | Mapping[str, Any]) -> RunConfig:
    """The composed config (a Hydra node, or the plain dict a verl worker was handed) as a `RunConfig`.

    A node the config lacks takes its dataclass's defaults (a worker may be handed only the slices it
    needs). A top-level key added with `+key=...` stays in `composed` (recorded in config.yaml) and
    configures nothing.

    Raises:
        ConfigError: an unknown key or a value of the wrong type, naming it (`section`).
    """
    data = plain(cfg) if OmegaConf.is_config(cfg) else {key: copy.deepcopy(plain(node)) for key, node in cfg.items()}
    slices = {key: section(data, key, slice_class(key)) for key in SLICES}
    scalars = {key: data[key] for key in ("experiment_name", "seed") if key in data}
    return RunConfig(**scalars, **slices, composed=data)


def check_training(run: RunConfig) -> None:
    """The checks across slices that a training config must pass, for its `trainer.backend`, in one place.

    embedded: the estimator and policy-loss names, the critic type, the rollout pipeline against the
    estimator and context policy, and the capability table (rl_factory/capabilities.py). verl: the critic
    type and the capability table with our keys (backends/verl/supported.py; imports no verl); verl's own
    registries and the table with verl's composed keys are checked by the launcher once it has them.

    Raises:
        ConfigError: one line naming the key (an `Unsupported` names the combination and the way out).
    """
    from rl_factory import capabilities

    alg, roll = run.algorithm, run.rollout
    if run.trainer.backend == "verl":
        from rl_factory.backends.verl import supported

        supported.check(run)
        return
    from rl_factory.algorithms.advantages import get_advantage
    from rl_factory.algorithms.correction import check_correction
    from rl_factory.algorithms.losses import get_policy_loss
    from rl_factory.critic import check_critic_type
    from rl_factory.pipeline import check_pipeline

    get_advantage(alg.advantage), get_policy_loss(alg.policy_loss), check_critic_type(alg.critic)
    check_pipeline(roll, alg.advantage, roll.context)  # filters, dynamic sampling, augmenters
    check_correction(alg.correction)  # algorithm.correction: the off-policy correction's own keys
    capabilities.check(run.trainer.backend, capabilities.facts(alg, roll, optim=run.optim, reward=run.reward,
                                                               trainer=run.trainer))
