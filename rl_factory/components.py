"""Building the shared pieces from their config slices: tools, policy, agent, reward, data.

Training and evaluation assemble the same objects the same way, so `main_eval.sh` scores a
checkpoint exactly as validation during training did.
"""
from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envs import ToolEnv, get_parser
from envs.environment import load_environment
from envs.limits import ToolLimits
from rl_factory.chat import ChatFormat
from rl_factory.data import DatasetError, Rows, load_dataset
from rl_factory.engines.hf import HFEngine
from rl_factory.base.errors import ConfigError
from rl_factory.pipeline.rollouts import PipelineConfig
from rl_factory.rollout import Agent, RolloutConfig, RolloutKeys
from rewards.combine import RewardConfig  # noqa: F401  (`reward.*` lives with the rewards)
from rewards.loader import REWARD_ARGS

log = logging.getLogger("rl_factory")


@dataclass
class DataConfig:
    """`data.*`: where prompts come from."""

    train_files: Any = "examples/calculator/data/train.jsonl"  # a path or a list
    val_files: Any = "examples/calculator/data/val.jsonl"
    prompt_key: str = "prompt"
    answer_key: str = "answer"
    system_prompt: str | None = None
    train_batch_size: int = 16
    val_limit: int | None = None


@dataclass
class EnvConfig:
    """`env.*`: the tools and the turn structure."""

    tools: Any = "configs/tools/calculator.yaml"  # a manifest path, an inline manifest mapping, or None
    max_turns: int = 3
    parser: str = "hermes"
    max_calls_per_turn: int = 16  # calls past it fail locally ("too_many_calls")
    max_tool_output_bytes: int = 64 * 1024  # a result's text is cut to this before it is kept or tokenized
    # An environment that speaks (envs.environment): "file.py:Class" or "pkg.module:Class", one per episode
    environment: str | None = None
    environment_kwargs: dict[str, Any] = field(default_factory=dict)  # its constructor's arguments


@dataclass
class SamplingConfig(RolloutKeys, PipelineConfig):
    """`rollout.*`: the rollout loop's knobs, the rollout pipeline's (filters, dynamic sampling,
    augmenters) and engine-level settings."""

    val_temperature: float = 0.0
    max_batch_size: int = 128
    engine_threads: int = 0  # the embedded engine's CPU threads; 0: one fewer than the trainer's


def open_env(cfg: EnvConfig, log_dir: Path | None = None, probe_sample: dict | None = None):
    """The tool env of the manifest (an async context manager), or an empty one without tools.

    `env.tools` is a manifest path, or the manifest itself inline (a mapping with `mcpServers`);
    `env.environment` is loaded (and its hooks checked) here. `probe_sample` (a dataset row) lists the
    tools of `scope: episode` servers whose launch line names the sample.
    """
    from rl_factory.config import ConfigError

    try:
        limits = ToolLimits(cfg.max_calls_per_turn, cfg.max_tool_output_bytes)
        environment = load_environment(cfg.environment, cfg.environment_kwargs)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if not cfg.tools:
        env = ToolEnv.empty(limits)
        env.environment = environment
        return env
    if isinstance(cfg.tools, Mapping):
        return ToolEnv.from_manifest(dict(cfg.tools), log_dir=log_dir, limits=limits, environment=environment,
                                     probe_sample=probe_sample)
    if not Path(cfg.tools).exists():
        from envs.manifest import ManifestError
        raise ManifestError(f"env.tools: tool manifest not found: {cfg.tools} (looked at {Path(cfg.tools).resolve()})")
    return ToolEnv.from_manifest(cfg.tools, log_dir=log_dir, limits=limits, environment=environment,
                                 probe_sample=probe_sample)


def build_agent(policy, env, env_cfg: EnvConfig, rollout_cfg: SamplingConfig, engine=None) -> Agent:
    """The rollout agent; generation by the policy itself (embedded engine) unless `engine` is given."""
    engine = engine or HFEngine(policy.model, eos_token_id=policy.tokenizer.eos_token_id,
                                pad_token_id=policy.tokenizer.pad_token_id,
                                max_batch_size=rollout_cfg.max_batch_size, autocast=policy.autocast,
                                threads=rollout_cfg.engine_threads, max_context=rollout_cfg.max_total_tokens)
    loop_cfg = loop_config(env_cfg, rollout_cfg)
    # env.tools is known here: the caller has awaited env.list_tools() (which starts the servers).
    parser = get_parser(env_cfg.parser, tools=env.tools)  # qwen3_xml coerces values by the schemas
    return Agent(engine, env, ChatFormat(policy.tokenizer, env.tools), parser, loop_cfg)


def loop_config(env_cfg: EnvConfig, rollout_cfg: SamplingConfig) -> RolloutConfig:
    """The rollout loop's own settings: `rollout.*` without the engine's, plus `env.max_turns`."""
    return RolloutConfig(**{k: getattr(rollout_cfg, k) for k in RolloutKeys.__dataclass_fields__},
                         max_turns=env_cfg.max_turns)


def load_rows(files: Any, cfg: DataConfig, limit: int | None = None) -> list[dict]:
    if not files:
        raise ConfigError("no data files given (set data.train_files / data.val_files)")
    return load_dataset(files, prompt_key=cfg.prompt_key, answer_key=cfg.answer_key,
                        system_prompt=cfg.system_prompt, limit=limit)


@contextlib.asynccontextmanager
async def closing_engine(agent: Agent):
    try:
        yield agent
    finally:
        await agent.engine.close()


class MissingColumn(DatasetError):
    """A row lacks a column the reward needs; `arg` is the reward's argument, `column` the dataset's."""

    def __init__(self, message: str, arg: str, column: str, have: int):
        super().__init__(message)
        self.arg, self.column, self.have = arg, column, have  # have: rows of that set that do have it


ANSWER_ARGS = ("answer", "ground_truth")  # reward arguments that hold the row's answer (ours, verl's)


def check_reward_columns(reward: Any, sets: Mapping[str, list[dict]], answer_key: str = "answer") -> None:
    """Every row of every set has the columns the reward's functions need, before anything runs.

    A required argument that is not a standard one (`REWARD_ARGS`) is a column every row must have; a
    required `answer` or verl's `ground_truth` (`ANSWER_ARGS`: always passed, None for a row without
    `answer_key`) must have a value in every row.
    Arguments with a default, `**kwargs` and arguments fixed by the config ask for nothing (a reward that
    names `answer` with a default, when no row has one, gets one warning).

    Args:
        reward: the run's `Scorer` (its `components`).
        sets: config key (data.train_files, ...) -> its rows (a `Rows` names the file and row).

    Raises:
        MissingColumn: one line naming the first such row (file and row index), the column and the reward.
    """
    for key, rows in sets.items():
        for component in reward.components:
            fn = component.fn
            needed = [a for a in fn.required if a not in REWARD_ARGS or a in ANSWER_ARGS]
            for i, row in enumerate(rows):
                absent = [a for a in needed if (row.get("answer") is None if a in ANSWER_ARGS else a not in row)]
                if absent:
                    raise _missing(fn.name, absent[0], key, rows, i, answer_key)
    optional = [c.fn.name for c in reward.components if "answer" in c.fn.arg_names and "answer" not in c.fn.required]
    if optional and not any(r.get("answer") is not None for rows in sets.values() for r in rows):
        log.warning("no row has the answer column %r (data.answer_key): reward %s gets answer=None", answer_key,
                    optional[0])


def _missing(name: str, arg: str, key: str, rows: list[dict], i: int, answer_key: str) -> MissingColumn:
    column = answer_key if arg in ANSWER_ARGS else arg
    have = sum(1 for r in rows if (r.get("answer") is not None if arg in ANSWER_ARGS else arg in r))
    where = rows.origin(i) if isinstance(rows, Rows) else f"{key} row {i}"
    # `answer` is the copy of answer_key that every row gets: shown only as the file's own column
    shown = sorted(k for k, v in rows[i].items()
                   if k != "messages" and (k != "answer" or (answer_key == "answer" and v is not None)))
    how = f"as `{arg}`, from data.answer_key" if arg in ANSWER_ARGS else f"as `{arg}`"
    message = (f"{where} has no {column!r} column, which reward {name} needs ({how}); {have} of {len(rows)} "
               f"rows of {key} have it; this row's columns: {shown[:8]}")
    return MissingColumn(message, arg, column, have)
