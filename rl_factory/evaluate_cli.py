"""`main_eval.sh`: evaluate a model or checkpoint with the training config's tools and reward.

With no `model.path`, the model is the last checkpoint of the run the same config would train
(`trainer.output_dir`, as `main_grpo.sh` with the same overrides), so `bash main_grpo.sh ...` followed by
`bash main_eval.sh ...` evaluates what was just trained; `model_path` says which one in one line.
"""
from __future__ import annotations

import json
import logging
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rl_factory import analysis
from rl_factory import interrupt
from rl_factory import checkpoint as ckpt
from rl_factory.components import build_agent, check_reward_columns, closing_engine, load_rows, open_env
from rl_factory.config import ConfigError, RunConfig, parse
from rl_factory.engines.openai import OpenAIEngine
from rl_factory.engines.base import SamplingParams
from rl_factory.evaluate import evaluate, trajectory_record, write_rollouts
from rl_factory.policy import ModelConfig, load_policy, load_tokenizer_only
from rl_factory.run import write_config
from rl_factory.tracking import json_safe
from rewards.scorer import build_scorer

log = logging.getLogger("rl_factory")
REPORTED = ["accuracy", "reward/mean", "num_turns/mean"]
TOOL_REPORTED = ["tool/call_rate", "tool/success_rate"]  # with tools
STOP_ORDER = ["env_done", "answer", "max_turns", "max_tokens", "episode_error"]  # with an environment: stop/*


@dataclass
class EvalConfig:
    """`eval.*`: what to evaluate and how to sample."""

    files: Any = "examples/calculator/data/val.jsonl"  # eval.yaml: ${data.val_files}
    limit: int | None = None
    n: int = 1
    temperature: float = 0.0
    top_p: float = 1.0
    output_dir: str | None = None
    engine: str = "hf"
    base_url: str | None = None
    served_model: str | None = None
    api_key_env: str = "OPENAI_API_KEY"
    compare: str | None = None
    bootstrap: int = 2000
    progress: bool = True


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
    """Evaluate for a composed eval config (configs/eval.yaml): `model.path` settled, then parsed once."""
    model_path(cfg)
    return interrupt.run(_run_eval(parse(cfg)))


def _output_dir(e: EvalConfig, model_path: str) -> Path:
    if e.output_dir:
        return Path(e.output_dir)
    if Path(model_path).is_dir():
        return Path(model_path) / "eval"
    return Path("outputs") / "eval"


def model_path(cfg) -> str:
    """`model.path`, or when it is null the last checkpoint in `trainer.output_dir` (written into `cfg`, so
    the evaluation's config.yaml and results name it), said in one line.

    Raises:
        ConfigError: no model.path and no checkpoint there; the message says how to train one or what to pass.
    """
    given = cfg.model.path
    if given is not None:
        return str(given)
    run_dir = Path(cfg.trainer.output_dir)
    latest = ckpt.latest_checkpoint(run_dir)
    if latest is None:
        raise ConfigError(f"no model.path given and {run_dir} has no checkpoint to evaluate: train one with "
                          "`bash main_grpo.sh` (with the same overrides), or pass model.path=<checkpoint dir, hub id, "
                          "or builtin:tiny-calculator for the untrained default>")
    cfg.model.path = str(latest)
    log.info("evaluating %s: the last checkpoint of the run in %s (model.path=... evaluates another model)",
             latest, run_dir)
    return cfg.model.path


async def _run_eval(cfg: RunConfig) -> dict[str, Any]:
    e, model_cfg, data_cfg, env_cfg, reward_cfg = cfg.eval, cfg.model, cfg.data, cfg.env, cfg.reward
    roll_cfg = cfg.rollout
    reward_fn = build_scorer(reward_cfg)
    rows = load_rows(e.files, data_cfg, limit=e.limit)
    check_reward_columns(reward_fn, {"eval.files": rows}, data_cfg.answer_key)
    other = _load_compare(e.compare)  # a bad eval.compare fails before any rollout
    out = _output_dir(e, model_cfg.path)
    # the servers' logs stay in anonymous files until the model loads
    async with open_env(env_cfg, probe_sample=rows[0] if rows else None) as env:
        if e.engine not in EVAL_ENGINES:
            raise ConfigError(f"eval.engine: unknown engine {e.engine!r} (valid: {', '.join(EVAL_ENGINES)})")
        tools = await env.list_tools()
        policy, engine = EVAL_ENGINES[e.engine](e, model_cfg, tools, int(cfg.seed))
        _start_output(out, cfg.composed, env)  # the first write into eval.output_dir
        agent = build_agent(policy, env, env_cfg, roll_cfg, engine=engine)
        async with closing_engine(agent):
            params = SamplingParams(e.temperature, e.top_p, roll_cfg.max_response_tokens, seed=int(cfg.seed))
            with _progress(len(rows) * e.n, e.progress) as bar:
                metrics, trajs = await evaluate(agent, reward_fn, rows, params, reward_cfg.success_threshold, n=e.n,
                                                on_done=bar)
    records = [trajectory_record(t) for t in trajs]
    threshold = reward_cfg.success_threshold
    rows_out = analysis.per_row(records, threshold)
    result = {"model": model_cfg.path, "resolved_model": policy.path, "files": e.files, "rows": len(rows),
              "n": e.n, "temperature": e.temperature, "metrics": metrics,
              "pass_at_k": analysis.pass_at_k(records, threshold),
              "failures": analysis.failure_taxonomy(records, threshold, has_tools=bool(tools)),
              "by_data_source": analysis.by_data_source(records, threshold),
              "by_tool": analysis.by_tool(records, threshold), "per_row": rows_out}
    if other is not None:
        compared = analysis.compare(rows_out, other["per_row"], e.bootstrap, int(cfg.seed))
        result["compare"] = {"other": e.compare, **compared}
    # NaN (e.g. tool/success_rate without calls) is not JSON; write null, as metrics.jsonl does.
    (out / "results.json").write_text(json.dumps(json_safe(result), indent=2, default=str))
    write_rollouts(out / "rollouts.jsonl", trajs)
    _print_summary(model_cfg.path, e, rows, result, has_tools=bool(tools), environment=bool(env_cfg.environment))
    log.info("results: %s", out / "results.json")
    return result


def _start_output(out: Path, cfg, env) -> None:
    """config.yaml (resolved, redacted: what `rl_factory.rescore` reads) and tool_logs/, once the model
    and the servers are up: an evaluation that cannot start leaves no directory behind."""
    out.mkdir(parents=True, exist_ok=True)
    write_config(out, cfg)
    env.log_to(out / "tool_logs")


def _load_compare(path: str | None) -> dict | None:
    if not path:
        return None
    try:
        other = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"eval.compare: cannot read {path}: {exc}") from None
    if not isinstance(other, dict) or not isinstance(other.get("per_row"), list):
        raise ConfigError(f"eval.compare: {path} has no per_row results (is it a results.json of main_eval.sh?)")
    return other


class _progress:
    """A bar over trajectories on a terminal; a callable `on_done(traj)` either way."""

    def __init__(self, total: int, enabled: bool):
        self.bar = None
        if enabled and sys.stderr.isatty():
            from tqdm import tqdm
            self.bar = tqdm(total=total, desc="eval", unit="traj", dynamic_ncols=True)

    def __enter__(self):
        return self

    def __call__(self, traj) -> None:
        if self.bar is not None:
            self.bar.update(1)

    def __exit__(self, *exc) -> None:
        if self.bar is not None:
            self.bar.close()


def _print_summary(model: str, e: EvalConfig, rows: list, result: dict, has_tools: bool = True,
                   environment: bool = False) -> None:
    log.info("evaluated %s on %d rows (%s)", model, len(rows), "greedy" if e.temperature == 0 else
             f"temperature {e.temperature}, n={e.n}")
    metrics = result["metrics"]
    for key in _reported(metrics, has_tools, environment):
        log.info("  %-18s %s", key, _fmt(metrics.get(key)))
    if e.n > 1:
        log.info("  %-18s %s", "pass@k", "  ".join(f"@{k} {v:.3f}" for k, v in result["pass_at_k"].items()))
    if result["failures"]:
        log.info("failures (share of all trajectories, example rows):")
        width = max(16, *map(len, result["failures"]))
        for kind, f in result["failures"].items():
            log.info("  %-*s %4d  %5.1f%%  %s", width, kind, f["count"], 100 * f["share"], ", ".join(f["examples"]))
    sources = result["by_data_source"]
    if len(sources) > 1:
        log.info("per data_source (rows, accuracy, reward):")
        for name, s in sources.items():
            log.info("  %-20s %4d  %.3f  %.3f", name, s["rows"], s["accuracy"], s["reward/mean"])
    if "compare" in result:
        c = result["compare"]
        log.info("compared with %s (%s rows, %d bootstrap resamples; this - other, 95%% CI):", e.compare,
                 "paired" if c["paired"] else "unpaired", c["resamples"])
        for name, d in c["metrics"].items():
            log.info("  %-12s %+.3f  [%+.3f, %+.3f]%s", name, d["difference"], d["ci_low"], d["ci_high"],
                     "  significant" if d["significant"] else "")


def _reported(metrics: dict, has_tools: bool, environment: bool) -> list[str]:
    """The summary's metrics: tool-call rates for a task with tools; how the episodes stopped (the shares
    of each stop_reason) for one with an environment, which is what says whether games were finished."""
    keys = REPORTED + (TOOL_REPORTED if has_tools else [])
    if environment:
        stops = [k for k in metrics if k.startswith("stop/")]
        keys += sorted(stops, key=lambda k: (STOP_ORDER.index(k[5:]) if k[5:] in STOP_ORDER else len(STOP_ORDER), k))
    return keys


def _fmt(value) -> str:
    return "n/a" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.3f}"

