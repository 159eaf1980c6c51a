"""The value rules: each numeric config key's type and range, and a few keys' fixed choices.

`check_values` runs where the config is composed (`rl_factory.config.load_config`), so that
`trainer.total_steps=-3` is refused, naming the key, before anything runs or is written. A new numeric
key or a key with fixed choices gets its rule in `VALUE_RULES`.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig, OmegaConf

from rl_factory.base.errors import ConfigError


@dataclass(frozen=True)
class Range:
    """A number's type (`int`, or `float`, which takes an int too) and bounds; `open_low`/`open_high`
    exclude the bound itself; `nullable`: null is allowed (it means "off" or "all" for that key)."""

    kind: type = float
    low: float | None = None
    high: float | None = None
    open_low: bool = False
    open_high: bool = False
    nullable: bool = False

    def allows(self, value: Any) -> bool:
        if value is None:
            return self.nullable
        if isinstance(value, bool) or not isinstance(value, (int, float) if self.kind is float else int):
            return False
        if self.low is not None and (value <= self.low if self.open_low else value < self.low):
            return False
        return self.high is None or (value < self.high if self.open_high else value <= self.high)

    def describe(self) -> str:
        what = "an integer" if self.kind is int else "a number"
        if self.low is not None and self.high is not None:
            what += (f" in {'(' if self.open_low else '['}{self.low:g}, {self.high:g}"
                     f"{')' if self.open_high else ']'}")
        elif self.low is not None:
            what += f" {'>' if self.open_low else '>='} {self.low:g}"
        elif self.high is not None:
            what += f" {'<' if self.open_high else '<='} {self.high:g}"
        return f"null or {what}" if self.nullable else what


@dataclass(frozen=True)
class OneOf:
    """A key with a fixed set of values, read from where the code that uses them defines them."""

    source: str  # "module:NAME" of a tuple (or dict) of the valid values; imported when a config is checked

    def choices(self) -> list[str]:
        module, _, name = self.source.partition(":")
        return list(getattr(importlib.import_module(module), name))

    def allows(self, value: Any) -> bool:
        return value in self.choices()

    def describe(self) -> str:
        return "one of " + ", ".join(self.choices())


def at_least(low: float, kind: type = int, nullable: bool = False) -> Range:
    return Range(kind, low, nullable=nullable)


def positive(kind: type = float, nullable: bool = False) -> Range:
    return Range(kind, 0, open_low=True, nullable=nullable)


# Dotted key -> rule, for the keys of configs/grpo.yaml and configs/eval.yaml (a key a config does not have
# is not checked). Choices that a registry owns (estimators, losses, parsers, ...) are checked by its lookup.
VALUE_RULES: dict[str, Range | OneOf] = {
    "seed": Range(int),
    "model.num_threads": at_least(0), "model.lora_rank": at_least(0), "model.lora_alpha": positive(),
    "data.train_batch_size": at_least(1), "data.val_limit": at_least(1, nullable=True),
    "env.max_turns": at_least(1), "env.max_calls_per_turn": at_least(1), "env.max_tool_output_bytes": at_least(1),
    "reward.success_threshold": Range(float), "reward.max_concurrency": at_least(1),
    "reward.on_error": OneOf("rewards.combine:ON_ERROR"), "reward.timeout_s": positive(nullable=True),
    "reward.process.tool_error_penalty": Range(float),
    "reward.process.outcome_mode": OneOf("rewards.process:OUTCOME_MODES"),
    "rollout.n": at_least(1), "rollout.temperature": at_least(0, float), "rollout.top_p": Range(float, 0, 1, open_low=True),
    "rollout.val_temperature": at_least(0, float), "rollout.max_response_tokens": at_least(1),
    "rollout.max_total_tokens": at_least(1), "rollout.max_tool_response_tokens": at_least(1),
    "rollout.max_batch_size": at_least(1), "rollout.engine_threads": at_least(0),
    "rollout.context_keep_turns": at_least(0),
    "rollout.dynamic_sampling.min_groups": at_least(1, nullable=True), "rollout.dynamic_sampling.max_rounds": at_least(1),
    "algorithm.critic.lr": positive(), "algorithm.critic.cliprange_value": positive(),
    "algorithm.critic.vf_coef": at_least(0, float),
    "algorithm.clip_ratio_low": Range(float, 0, 1, open_high=True), "algorithm.clip_ratio_high": at_least(0, float),
    "algorithm.kl_coef": at_least(0, float),
    "algorithm.arena.rounds": at_least(1, nullable=True),
    "algorithm.arena.judge.max_concurrency": at_least(1), "algorithm.arena.judge.max_retries": at_least(0),
    "algorithm.arena.judge.backoff_s": at_least(0, float), "algorithm.arena.judge.timeout_s": positive(),
    "algorithm.arena.judge.temperature": at_least(0, float), "algorithm.arena.judge.max_tokens": at_least(1),
    "optim.lr": positive(), "optim.weight_decay": at_least(0, float), "optim.warmup_steps": at_least(0),
    "optim.grad_clip": positive(), "optim.ppo_epochs": at_least(1), "optim.mini_batches": at_least(1),
    "optim.micro_batch_size": at_least(1), "optim.micro_batch_tokens": at_least(1, nullable=True),
    "trainer.total_steps": at_least(1), "trainer.eval_every": at_least(0), "trainer.save_every": at_least(0),
    "trainer.keep_checkpoints": at_least(0), "trainer.max_staleness": at_least(0),
    "eval.limit": at_least(1, nullable=True), "eval.n": at_least(1), "eval.temperature": at_least(0, float),
    "eval.top_p": Range(float, 0, 1, open_low=True), "eval.bootstrap": at_least(1),
}
_ABSENT = object()


def check_values(cfg: DictConfig, rules: dict[str, Range | OneOf] = VALUE_RULES) -> None:
    """Every key of `rules` that `cfg` has, against its rule.

    Raises:
        ConfigError: the first bad value, naming the key, the value and what is allowed.
    """
    for key, rule in rules.items():
        value = OmegaConf.select(cfg, key, default=_ABSENT)
        if value is _ABSENT or rule.allows(value):
            continue
        shown = "null" if value is None else repr(value) if isinstance(value, str) else value
        raise ConfigError(f"{key}={shown}: must be {rule.describe()}")
