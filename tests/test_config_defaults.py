"""One source of defaults: the slices' dataclasses (rl_factory.config.SLICES) and configs/grpo.yaml / eval.yaml
hold the same keys and the same values.

The check fails on drift in either direction: a YAML key with no field, a field with no YAML key, a default
that differs. A key whose YAML value is an interpolation (`outputs/${experiment_name}`) is compared as it
resolves with every other key at its default.
"""
import dataclasses

from omegaconf import OmegaConf

from rl_factory.components import EnvConfig, SamplingConfig
from rl_factory.config import SLICES, RunConfig, load_config, parse
from rl_factory.rollout import RolloutConfig, RolloutKeys
from rl_factory.update import OptimConfig

# What eval.yaml sets differently from grpo.yaml's defaults on purpose (its own comment says why).
EVAL_OVERRIDES = {"model.path": None}


def composed(name: str) -> dict:
    return OmegaConf.to_container(load_config(name, []), resolve=True)


def drift(obj, data: dict, prefix: str = "", skip: tuple[str, ...] = ()) -> list[str]:
    """Every difference between dataclass instance `obj` and the config mapping `data`, one line each
    (`skip`: fields of `obj` not compared)."""
    fields = {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj) if f.name not in ("composed", *skip)}
    out = []
    for name in sorted(set(fields) | set(data)):
        key = f"{prefix}{name}"
        if name not in data:
            out.append(f"{key}: a field with no YAML key (default {fields[name]!r})")
        elif name not in fields:
            out.append(f"{key}: a YAML key with no field (value {data[name]!r})")
        elif dataclasses.is_dataclass(fields[name]):
            out += drift(fields[name], data[name], key + ".")
        elif fields[name] != data[name] or isinstance(fields[name], bool) != isinstance(data[name], bool):
            out.append(f"{key}: the dataclass says {fields[name]!r}, the YAML {data[name]!r}")
    return out


def test_grpo_yaml_and_the_dataclasses_agree_on_every_key_and_default():
    assert drift(RunConfig(), composed("grpo"), skip=("eval",)) == []


def test_eval_yaml_and_the_dataclasses_agree_but_for_its_documented_overrides():
    data = composed("eval")
    for key, value in EVAL_OVERRIDES.items():
        parent, _, leaf = key.rpartition(".")
        assert data[parent][leaf] == value  # still overridden; else drop it from EVAL_OVERRIDES
        data[parent][leaf] = getattr(getattr(RunConfig(), parent), leaf)
    assert drift(RunConfig(), data) == []


def test_the_drift_check_fails_on_drift_in_either_direction():
    data = composed("grpo")
    data["optim"]["lr"] = 1e-3
    data["trainer"]["new_key"] = 1
    del data["rollout"]["n"]
    assert drift(RunConfig(), data, skip=("eval",)) == [
        "optim.lr: the dataclass says 0.0003, the YAML 0.001",
        "rollout.n: a field with no YAML key (default 8)",
        "trainer.new_key: a YAML key with no field (value 1)",
    ]


def test_the_default_job_parses_to_the_dataclass_defaults():
    run = parse(load_config("grpo", []))
    assert dataclasses.replace(run, composed={}) == RunConfig()
    assert set(SLICES) - {"eval"} <= set(run.composed)


def test_code_that_builds_a_slice_gets_the_product_default():
    # tests and library users build OptimConfig() and the like: they train at the product's rate
    assert OptimConfig().lr == composed("grpo")["optim"]["lr"]
    assert OptimConfig().warmup_steps == composed("grpo")["optim"]["warmup_steps"]


def test_the_rollout_loop_config_adds_no_rollout_key():
    # RolloutConfig's own fields are env.max_turns and verl's cap: no `rollout.*` key of their own
    loop_only = {f.name for f in dataclasses.fields(RolloutConfig)} - {f.name for f in dataclasses.fields(RolloutKeys)}
    assert loop_only == {"max_turns", "max_tail_tokens"}
    assert not loop_only & {f.name for f in dataclasses.fields(SamplingConfig)}
    assert RolloutConfig().max_turns == EnvConfig().max_turns
