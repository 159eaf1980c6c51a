"""One arm of the arena-vs-pointwise experiment: a training run on the embedded default against a stand-in judge.

`run_arm(arm, noise, seed, settings, judge_cfg, out_dir)` starts a stand-in judge server (judge_server.py)
on a free localhost port, trains `bash main_grpo.sh` in a subprocess with the arm's overrides, and
returns what the benchmark needs (also kept beside the run as `<run>.result.json`, which a later
invocation with the same settings reuses instead of training again): the greedy policy's true quality at
each validation step, the judge requests each training step caused (read from the server's call log,
each call placed in the step whose rollouts asked that question), and the arena metrics.

Arms (`ARMS`):
- `oracle`: grpo on the true quality (`task.py:reward`); no judge.
- `pointwise`: grpo on the pointwise judge (`rewards.llm_reward:llm_judge` with `pointwise_rubric.txt`);
  the true quality rides along as a weight-0 component, so validation reports it.
- one arm per arena topology: `algorithm.advantage=arena` with the pairwise judge
  (`algorithm.arena.judge.type=llm`, `pairwise_prompt.txt`); the reward is the true quality, used
  only for validation and `arena/reward_spearman`.
"""
from __future__ import annotations

import json
import os
import subprocess
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from examples.arena_vs_pointwise.judge_server import JudgeServer, StandInConfig
from rl_factory.algorithms.arena import TOPOLOGIES
from rl_factory.jsonl import read_records

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent.relative_to(ROOT)
TASK_REWARD = f"{HERE}/task.py:reward"
# the built-in topologies, cheapest first (judge matches per group of 8: 7, 12, 14, 14, 28)
TOPOLOGY_ARMS = ("anchor", "swiss", "single_elimination", "double_elimination", "round_robin")
ARMS = ("oracle", "pointwise", *TOPOLOGY_ARMS)
ARENA_KEYS = ("arena/judge_calls", "arena/judge_requests", "arena/judge_cache_hits", "arena/ties",
              "arena/judge_failures", "arena/skipped_groups", "arena/reward_spearman")


@dataclass
class Settings:
    """The `experiment:` section of config.yaml (sizes shared by every arm)."""

    steps: int = 12
    model: str = "builtin:tiny-calculator"
    train_batch_size: int = 8
    n: int = 8
    eval_every: int = 3
    val_limit: int = 32
    timeout_s: float = 1800.0


def overrides(arm: str, base_url: str | None, run_dir: Path, seed: int, s: Settings) -> list[str]:
    """The `main_grpo.sh` arguments of one arm (the embedded default's model, tools and data)."""
    model = base_model() if s.model == Settings.model else s.model
    common = [f"experiment_name={run_dir.name}", f"trainer.output_dir={run_dir}", f"seed={seed}",
              f"trainer.total_steps={s.steps}", f"data.train_batch_size={s.train_batch_size}", f"rollout.n={s.n}",
              f"trainer.eval_every={s.eval_every}", "trainer.save_every=0", "trainer.keep_checkpoints=1",
              "trainer.report=false", "trainer.progress=false", "trainer.resume=never",
              f"data.val_limit={s.val_limit}", f"model.path={model}", "model.device=cpu", "model.num_threads=1"]
    if arm == "oracle":
        return [*common, f"reward.function={TASK_REWARD}"]
    if arm == "pointwise":
        judge = (f"{{function: 'rewards.llm_reward:llm_judge', weight: 1.0, name: judge, kwargs: {{model: standin, "
                 f"base_url: '{base_url}', api_key_env: null, rubric: {HERE}/pointwise_rubric.txt}}}}")
        return [*common, f"reward.functions=[{{function: '{TASK_REWARD}', weight: 0.0, name: quality}}, {judge}]"]
    if arm not in TOPOLOGIES:
        raise ValueError(f"unknown arm {arm!r}; valid: {list(ARMS)}")
    return [*common, f"reward.function={TASK_REWARD}", "algorithm.advantage=arena",
            f"algorithm.arena.topology={arm}", "algorithm.arena.judge.type=llm",
            f"algorithm.arena.judge.base_url={base_url}", "algorithm.arena.judge.model=standin",
            "algorithm.arena.judge.api_key_env=null", f"algorithm.arena.judge.prompt={HERE}/pairwise_prompt.txt"]


def base_model() -> str:
    """The seed-0 build of builtin:tiny-calculator (the project's default model), built here if missing.

    Every seed starts from this one model: `seed=N` with `model.path=builtin:tiny-calculator` would build
    a model of its own per seed (minutes of warm start each); the seed still varies data order and sampling.
    """
    from rl_factory.models.tiny import TinyModelConfig, ensure_tiny_model

    return str(ensure_tiny_model(TinyModelConfig(seed=0)))


def run_arm(arm: str, noise: float | None, seed: int, s: Settings, judge_cfg: StandInConfig, out_dir: Path,
            train: bool = True) -> dict | None:
    """Train one arm for one seed (and judge noise); returns its curves and counts (see the module docstring).
    With `train=False`, only a finished run is read back (None when there is none).

    Raises:
        RuntimeError: the training run failed (its log's tail in the message).
    """
    run_dir = out_dir / (f"{arm}-s{seed}" if noise is None else f"{arm}-noise{noise:g}-s{seed}")
    done = run_dir.parent / f"{run_dir.name}.result.json"
    key = {"settings": _settings_key(s), "judge": asdict(judge_cfg)}
    if done.exists():  # finished by an earlier invocation with the same settings: kept, not retrained
        kept = json.loads(done.read_text())
        if kept.pop("key", None) == key:
            return kept
    if not train:
        return None
    cfg = replace(judge_cfg, noise=judge_cfg.noise if noise is None else noise, seed=judge_cfg.seed + seed)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    started = time.perf_counter()
    with JudgeServer(cfg) as server:
        cmd = ["bash", str(ROOT / "main_grpo.sh"), *overrides(arm, None if arm == "oracle" else server.base_url,
                                                             run_dir, seed, s)]
        run_dir.parent.mkdir(parents=True, exist_ok=True)
        with open(run_dir.parent / f"{run_dir.name}.log", "w") as log:
            proc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=s.timeout_s)
        calls = list(server.judge.calls)
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        tail = (run_dir.parent / f"{run_dir.name}.log").read_text()[-1500:]
        raise RuntimeError(f"{arm} seed {seed} noise {noise}: training failed (exit {proc.returncode}):\n{tail}")
    result = {"arm": arm, "noise": noise, "seed": seed, "run_dir": str(run_dir), "wall_s": round(wall, 1),
              **collect(run_dir, calls, arm)}
    done.write_text(json.dumps({**result, "key": key}))
    return result


def _settings_key(s: Settings) -> dict[str, Any]:
    settings = asdict(s)
    if settings["model"] == Settings.model:  # the default model is left out: keys written before it was a setting
        settings.pop("model")
    return settings


def collect(run_dir: Path, calls: list[dict], arm: str) -> dict[str, Any]:
    """Validation curve, judge requests per training step and arena metrics of a finished run."""
    metrics = read_records(run_dir / "metrics.jsonl")
    key = "val/reward/quality/mean" if arm == "pointwise" else "val/reward/mean"
    val = [[m["step"], m[key]] for m in metrics if key in m]
    step_of = {}
    for path in sorted((run_dir / "rollouts").glob("step_*.jsonl")):
        step = int(path.stem.split("_")[1])
        for row in read_records(path):
            step_of.setdefault(first_user(row["messages"]), step)
    steps = sorted({m["step"] for m in metrics if m["step"] > 0})
    per_step = {step: 0 for step in steps}
    val_calls = 0
    for call in calls:
        step = step_of.get(call["question"])
        if step is None:
            val_calls += 1  # a validation question (the pointwise arm's reward scores validation too)
        else:
            per_step[step] = per_step.get(step, 0) + 1
    arena = {k: [m.get(k) for m in metrics if m["step"] > 0 and "reward/mean" in m] for k in ARENA_KEYS}
    return {"val": val, "judge_requests": [per_step[s] for s in steps], "val_judge_requests": val_calls,
            "train_quality": [m.get("reward/quality/mean", m.get("reward/mean")) for m in metrics
                              if m["step"] > 0 and "reward/mean" in m],
            "arena": {k.split("/", 1)[1]: v for k, v in arena.items() if any(x is not None for x in v)}}


def first_user(messages: list[dict]) -> str:
    return next((str(m.get("content") or "") for m in messages if m.get("role") == "user"), "")
