"""`main_eval.sh`: evaluate a model or checkpoint with the training config's tools and reward."""
from __future__ import annotations

import asyncio
import json
import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rl_factory.components import (DataConfig, EnvConfig, RewardConfig, SamplingConfig, build_agent,
                                   closing_engine, load_rows, open_env)
from rl_factory.config import ConfigError, section
from rl_factory.engines.openai import OpenAIEngine
from rl_factory.engines.base import SamplingParams
from rl_factory.evaluate import evaluate, write_rollouts
from rl_factory.policy import ModelConfig, load_policy, load_tokenizer_only
from rewards.scorer import build_scorer

log = logging.getLogger("rl_factory")
REPORTED = ["accuracy", "reward/mean", "num_turns/mean", "tool/call_rate", "tool/success_rate"]


@dataclass
class EvalConfig:
    """`eval.*`: what to evaluate and how to sample."""

    files: Any = None
    limit: int | None = None
    n: int = 1
    temperature: float = 0.0
    top_p: float = 1.0
    output_dir: str | None = None
    engine: str = "hf"
    base_url: str | None = None
    served_model: str | None = None
    api_key_env: str = "OPENAI_API_KEY"


def _embedded(e: EvalConfig, model_cfg: ModelConfig, tools: list[dict], seed: int):
    """The checkpoint is loaded here and generates with the embedded engine."""
    return load_policy(model_cfg, tools, seed=seed, log=log.info), None


def _served(e: EvalConfig, model_cfg: ModelConfig, tools: list[dict], seed: int):
    """A vLLM/SGLang server generates; only the tokenizer (chat template) is loaded here."""
    if not e.base_url:
        raise ConfigError("eval.base_url is required with eval.engine=openai")
    policy = load_tokenizer_only(model_cfg, tools, seed=seed, log=log.info)
    engine = OpenAIEngine(e.base_url, model=e.served_model or model_cfg.path,
                          eos_token_id=policy.tokenizer.eos_token_id, api_key_env=e.api_key_env)
    return policy, engine


EVAL_ENGINES = {"hf": _embedded, "openai": _served}


def run_eval(cfg) -> dict[str, Any]:
    return asyncio.run(_run_eval(cfg))


def _output_dir(e: EvalConfig, model_path: str) -> Path:
    if e.output_dir:
        return Path(e.output_dir)
    if Path(model_path).is_dir():
        return Path(model_path) / "eval"
    return Path("outputs") / "eval"


async def _run_eval(cfg) -> dict[str, Any]:
    e = section(cfg, "eval", EvalConfig)
    model_cfg, data_cfg = section(cfg, "model", ModelConfig), section(cfg, "data", DataConfig)
    env_cfg, reward_cfg = section(cfg, "env", EnvConfig), section(cfg, "reward", RewardConfig)
    roll_cfg = section(cfg, "rollout", SamplingConfig)
    reward_fn = build_scorer(reward_cfg)
    rows = load_rows(e.files, data_cfg, limit=e.limit)
    out = _output_dir(e, model_cfg.path)
    async with open_env(env_cfg, log_dir=out / "tool_logs") as env:
        if e.engine not in EVAL_ENGINES:
            raise ConfigError(f"eval.engine: unknown engine {e.engine!r} (valid: {', '.join(EVAL_ENGINES)})")
        policy, engine = EVAL_ENGINES[e.engine](e, model_cfg, await env.list_tools(), int(cfg.seed))
        agent = build_agent(policy, env, env_cfg, roll_cfg, engine=engine)
        async with closing_engine(agent):
            params = SamplingParams(e.temperature, e.top_p, roll_cfg.max_response_tokens)
            metrics, trajs = await evaluate(agent, reward_fn, rows, params, reward_cfg.success_threshold, n=e.n)
    out.mkdir(parents=True, exist_ok=True)
    # NaN (e.g. tool/success_rate without calls) is not JSON; write null, as metrics.jsonl does.
    finite = {k: None if isinstance(v, float) and math.isnan(v) else v for k, v in metrics.items()}
    result = {"model": model_cfg.path, "resolved_model": policy.path, "files": e.files, "rows": len(rows),
              "n": e.n, "temperature": e.temperature, "metrics": finite}
    (out / "results.json").write_text(json.dumps(result, indent=2, default=str))
    write_rollouts(out / "rollouts.jsonl", trajs)
    log.info("evaluated %s on %d rows (%s)", model_cfg.path, len(rows), "greedy" if e.temperature == 0 else
             f"temperature {e.temperature}, n={e.n}")
    for key in REPORTED:
        value = metrics.get(key, float("nan"))
        log.info("  %-18s %s", key, "n/a" if math.isnan(value) else f"{value:.3f}")
    log.info("results: %s", out / "results.json")
    return result
