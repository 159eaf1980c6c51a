"""Building the shared pieces from their config slices: tools, policy, agent, reward, data.

Training and evaluation assemble the same objects the same way, so `main_eval.sh` scores a
checkpoint exactly as validation during training did.
"""
from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envs import ToolEnv, get_parser
from envs.environment import load_environment
from envs.limits import ToolLimits
from rl_factory.chat import ChatFormat
from rl_factory.data import load_dataset
from rl_factory.engines.hf import HFEngine
from rl_factory.errors import ConfigError
from rl_factory.pipeline.rollouts import PipelineConfig
from rl_factory.rollout import Agent, RolloutConfig
from rewards.combine import RewardConfig  # noqa: F401  (`reward.*` lives with the rewards)


@dataclass
class DataConfig:
    """`data.*`: where prompts come from."""

    train_files: Any = None
    val_files: Any = None
    prompt_key: str = "prompt"
    answer_key: str = "answer"
    system_prompt: str | None = None
    train_batch_size: int = 16
    val_limit: int | None = None


@dataclass
class EnvConfig:
    """`env.*`: the tools and the turn structure."""

    tools: Any = None  # a manifest path, an inline manifest mapping, or None
    max_turns: int = 3
    parser: str = "hermes"
    max_calls_per_turn: int = 16  # calls past it fail locally ("too_many_calls")
    max_tool_output_bytes: int = 64 * 1024  # a result's text is cut to this before it is kept or tokenized
    # An environment that speaks (envs.environment): "file.py:Class" or "pkg.module:Class", one per episode
    environment: str | None = None
    environment_kwargs: dict[str, Any] = field(default_factory=dict)  # its constructor's arguments


@dataclass
class SamplingConfig(RolloutConfig, PipelineConfig):
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
    loop_cfg = RolloutConfig(**{k: getattr(rollout_cfg, k) for k in RolloutConfig.__dataclass_fields__})
    loop_cfg.max_turns = env_cfg.max_turns
    return loop_cfg


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
