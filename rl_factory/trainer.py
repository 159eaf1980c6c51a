"""The embedded trainer: GRPO-style RL for a tool-using agent, in one process on CPU or one GPU.

`train()` reads top to bottom like the algorithm:
  for each step: sample prompts -> n async multi-turn rollouts per prompt (tools via MCP) -> reward ->
  filters (and more prompts until enough groups survive: dynamic sampling) -> augmenters (training views) ->
  group advantages (registry) -> policy-loss update (registry) -> log / validate / save.
Everything up to the advantages is the rollout pipeline (rl_factory/pipeline). What the estimator
reads beyond rewards comes from the providers of the inputs it declares (rl_factory/providers.py): the
tournament (`scores`), inside the pipeline; a value head's values (`values`, rl_factory/critic.py), whose
value loss joins the policy loss; per-token rewards and masks.
Validation (greedy by default) runs at step 0, every `trainer.eval_every` steps and at the end; its
time is `timing/val_s` of that step, apart from the step's own `timing/step_s`.
A run killed at any point resumes from its last checkpoint with `trainer.resume=auto`.
"""
from __future__ import annotations

import contextlib
import functools
import gc
import logging
import random
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig

from rl_factory import capabilities
from rl_factory import interrupt
from rl_factory import checkpoint as ckpt
from rl_factory.allocator import update_peak_bytes, warm_heap
from rl_factory.components import (RewardConfig, SamplingConfig, build_agent, check_reward_columns, closing_engine,
                                   load_rows, open_env)
from rl_factory.config import ConfigError, RunConfig, check_training, parse
from rl_factory.asynchrony import build_ahead
from rl_factory.algorithms.correction import check_correction
from rl_factory.data import PromptSampler
from rl_factory.engines.base import SamplingParams, derive_seed
from rl_factory.evaluate import evaluate, summarize, write_rollouts
from rl_factory.guard import GuardConfig, build_guard
from rl_factory.lora import is_lora, load_adapter
from rl_factory.pipeline import RolloutPipeline
from rl_factory.policy import load_policy
from rl_factory.providers import ProviderContext, build_providers
from rl_factory.run import RunDir, StepProgress
from rl_factory.tracking import Tracker, check_loggers
from rl_factory.update import AlgorithmConfig, NonFiniteGuard, OptimConfig, load_reference, update_policy
from rewards.scorer import build_scorer

log = logging.getLogger("rl_factory")
VAL_SEED_KEY = 1 << 32  # validation seeds apart from the training steps'


@dataclass
class TrainerConfig:
    """`trainer.*`: the loop, its outputs and resume."""

    backend: str = "embedded"
    total_steps: int = 40
    output_dir: str = "outputs/calculator_grpo"  # grpo.yaml: outputs/${experiment_name}
    eval_every: int = 20
    save_every: int = 20
    keep_checkpoints: int = 2
    logger: list[str] = field(default_factory=lambda: ["console", "jsonl"])
    resume: str = "auto"
    save_rollouts: bool = True
    progress: bool = True
    report: bool = True
    guard: GuardConfig = field(default_factory=GuardConfig)  # the run guard (rl_factory/guard)
    # Policy versions a rollout may run ahead of the update (0 = on-policy); rl_factory/asynchrony.py
    max_staleness: int = 0
    # With max_staleness > 0: new weights reach running trajectories between tokens (true) or only between
    # trajectories (false)
    partial_rollouts: bool = True


def train(cfg: RunConfig | DictConfig) -> dict[str, Any]:
    """Run training from a parsed config (or a composed one, parsed here once); returns the final summary."""
    cfg = cfg if isinstance(cfg, RunConfig) else parse(cfg)
    try:
        return interrupt.run(_train(cfg))
    finally:
        gc.unfreeze()  # a caller that goes on (a notebook, the tests) gets its heap collected again


async def _train(cfg: RunConfig) -> dict[str, Any]:
    t_cfg, model_cfg, data_cfg, env_cfg, reward_cfg = cfg.trainer, cfg.model, cfg.data, cfg.env, cfg.reward
    roll_cfg, alg, optim_cfg, seed = cfg.rollout, cfg.algorithm, cfg.optim, int(cfg.seed)
    # The run directory is read first (is it this run's? where to resume?) and written only after the
    # checks below: a refused or mistyped config leaves a finished run's files untouched.
    run = RunDir(Path(t_cfg.output_dir))
    resume_from = run.resume_point(cfg.composed, t_cfg.resume, t_cfg.total_steps)
    if run.finished_step is not None:  # trainer.total_steps at or below the checkpoint's step
        return run.nothing_to_do(t_cfg.total_steps)
    _seed_everything(seed)

    # Names, data and reward are checked first: a typo should fail before any server or model starts.
    check_training(cfg)  # names, critic, pipeline, and what the embedded backend cannot train (one place)
    # The one reward path: reward.function(s) with weights, per-turn process rewards, executor, timeout, on_error.
    scorer = build_scorer(reward_cfg)
    # What the estimator reads beyond rewards, from the providers of the inputs it declares (a tournament, a critic)
    providers = build_providers(ProviderContext(alg, scorer, optim_cfg))
    train_rows = load_rows(data_cfg.train_files, data_cfg)
    val_rows = load_rows(data_cfg.val_files, data_cfg, limit=data_cfg.val_limit)
    check_reward_columns(scorer, {"data.train_files": train_rows, "data.val_files": val_rows}, data_cfg.answer_key)
    sampler = PromptSampler(train_rows, data_cfg.train_batch_size, seed=seed)
    train_params = SamplingParams(roll_cfg.temperature, roll_cfg.top_p, roll_cfg.max_response_tokens)
    val_params = SamplingParams(roll_cfg.val_temperature, 1.0, roll_cfg.max_response_tokens)
    # Parses the manifest and loads env.environment; starts nothing (servers' logs stay in anonymous files
    # until run.start). The first training row lists the tools of per-episode servers whose launch line names
    # the sample.
    tools = open_env(env_cfg, probe_sample=train_rows[0] if train_rows else None)
    check_loggers(t_cfg.logger)  # a logger whose package is missing: one line, before any write

    async with tools as env, providers:
        # Servers start here, not on entering: a task without tools starts none. A server that cannot
        # start, a model that cannot be loaded or a checkpoint that does not fit it fails before run.start.
        policy = load_policy(model_cfg, await env.list_tools(), seed=seed, log=log.info)
        if policy.device.type == "cuda":
            log.info("training on %s with the embedded backend (HF generate, one process); trainer.backend=verl is "
                     "the fast GPU path (vLLM rollouts, FSDP, packed sequences): README 'Scaling out'", policy.device)
        scorer.use_tools(env)  # a reward's `tools`: each trajectory's own episode (rollout_groups), else these
        providers.attach(policy)  # e.g. the critic's value head, on the policy's hidden states
        param_groups = [{"params": [p for p in policy.model.parameters() if p.requires_grad]},  # LoRA: adapters
                        *providers.param_groups()]  # e.g. the critic, at its own rate
        optimizer = torch.optim.AdamW(param_groups, lr=optim_cfg.lr, weight_decay=optim_cfg.weight_decay)
        scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda s: min(1.0, (s + 1) / max(1, optim_cfg.warmup_steps)))
        ref_model = load_reference(policy.model, alg)  # None unless the KL penalty is on
        step, history = 0, {}
        if resume_from is not None:
            providers.load(resume_from)  # before the optimizer state, which holds their parameters' moments
            step, history = _resume(resume_from, policy, optimizer, scheduler, sampler)
        run.start(cfg.composed, resumed=resume_from is not None, tools=env)  # the first write into the run directory
        if resume_from is not None:
            log.info("resumed from %s (step %d)", resume_from, step)
        agent = build_agent(policy, env, env_cfg, roll_cfg)
        pipeline = RolloutPipeline(roll_cfg, agent=agent, rows=train_rows, sampler=sampler,
                                   batch_size=data_cfg.train_batch_size, group_size=roll_cfg.n, params=train_params,
                                   scorer=scorer, group_stage=providers.group_stage, anchor_params=val_params,
                                   seed=seed)
        # trainer.max_staleness > 0: later steps' rollouts run while a step trains; None = on-policy
        ahead = build_ahead(t_cfg.max_staleness, t_cfg.partial_rollouts, pipeline, sampler, agent, policy, step,
                            t_cfg.total_steps)
        tracker = Tracker(run.path, t_cfg.logger, config=run.config, resume_step=step + 1 if step else 0)
        guard = build_guard(cfg, run.path, step, policy=policy, agent=agent, scorer=scorer, resume_from=resume_from)
        providers.start(run.path, resume_step=step + 1 if step else 0)  # e.g. the tournament's rankings.csv
        if policy.device.type == "cpu":  # an update's peak memory, touched once now instead of in the steps
            warm_heap(update_peak_bytes(policy.model.config, optim_cfg.micro_batch_tokens
                                        or optim_cfg.micro_batch_size * roll_cfg.max_total_tokens))
        _freeze_heap()

        async def validate(at_step: int) -> tuple[dict[str, float], float]:
            """The val/* metrics at `at_step`, and the seconds validation took (timing/val_s, not in step_s)."""
            start = time.perf_counter()
            params = replace(val_params, seed=derive_seed(seed, VAL_SEED_KEY, at_step))
            metrics, trajs = await evaluate(agent, scorer, val_rows, params, reward_cfg.success_threshold)
            agent.timing(), _engine_metrics(agent.engine)  # validation time is not a training step's
            if t_cfg.save_rollouts:
                write_rollouts(run.path / "rollouts" / f"val_step_{at_step:06d}.jsonl", trajs)
            return {f"val/{k}": v for k, v in metrics.items()}, time.perf_counter() - start

        async with closing_engine(agent), ahead or contextlib.nullcontext():
            if step == 0:  # the "before" of the closing summary
                history["first_val"], val_s = await validate(0)
                tracker.log({**history["first_val"], "timing/val_s": val_s}, step=0)
                run.write_report(t_cfg.report)
            progress = StepProgress(t_cfg.total_steps, start=step, enabled=t_cfg.progress)
            nonfinite = NonFiniteGuard(optim_cfg.max_nonfinite_steps)  # a streak of skipped steps spans steps
            while step < t_cfg.total_steps:
                step += 1
                t0 = time.perf_counter()
                env.reset_metrics()  # tool/* metrics are this step's, not cumulative since the start
                # 1-3. Rollouts, rewards, filters: sample prompts (the sampler's position is checkpointed),
                #      roll out n trajectories per prompt (async, multi-turn, tools over MCP), score each as it
                #      finishes, drop what should not train (rollout.filters); with rollout.dynamic_sampling,
                #      more prompts until enough groups survive. A group stage (arena's tournament) plays here.
                #      Sampling is seeded per step and round (and per trajectory and turn inside).
                batch = await (ahead.batch(step) if ahead else pipeline.collect(step))
                groups, trajs = batch.groups, batch.kept
                # 4. Augment: the training samples of each kept trajectory (rollout.augment; default: itself).
                augment_metrics = await pipeline.augment(batch)
                t2 = time.perf_counter()
                # 5. Advantages from the registry over the survivors of each group, with the inputs the
                #    estimator declares filled by their providers (e.g. the critic's values of every token).
                input_metrics = providers.assign(groups, batch.scores, alg.advantage_options)
                # 6. Policy update with the registered policy loss, plus the extra loss terms (KL, the providers').
                update = functools.partial(update_policy, policy, optimizer, scheduler, trajs, alg, optim_cfg,
                                           ref_model, seed + step, terms=providers.loss_terms(), guard=nonfinite)
                if ahead is not None:  # in a thread, then its weights go to the generator
                    actor = {**await ahead.update(update, step), **ahead.metrics(trajs, step)}
                else:
                    with interrupt.interruptible():  # synchronous: Ctrl-C / SIGTERM stop it now, not after it
                        actor = update()
                t3 = time.perf_counter()
                # 7. Log, write rollouts, validate and checkpoint.
                metrics = {**summarize(batch.trajectories, reward_cfg.success_threshold), **batch.metrics, **actor,
                           **env.metrics(), **agent.timing(), **_engine_metrics(agent.engine), **augment_metrics,
                           **input_metrics, "timing/update_s": t3 - t2}
                metrics.update(await guard.after_step(step, trajs, metrics))  # guard/*: the run's invariants
                if t_cfg.save_rollouts:  # dropped trajectories too, with the filter that dropped them
                    write_rollouts(run.path / "rollouts" / f"step_{step:06d}.jsonl", batch.trajectories)
                last = step == t_cfg.total_steps
                val_s = 0.0
                if last or (t_cfg.eval_every and step % t_cfg.eval_every == 0):
                    history["last_val"], val_s = await validate(step)
                    metrics.update(history["last_val"], **{"timing/val_s": val_s})
                # The step's own work: validation is logged beside it (timing/val_s), not inside it.
                metrics["timing/step_s"] = time.perf_counter() - t0 - val_s
                tracker.log(metrics, step=step)
                guard.enforce()  # a `stop` check fired: GuardStop, exit code 3 (its bundle is in guard/)
                progress.update(step, metrics)
                if "val/accuracy" in metrics:  # report.html: at every validation and the end
                    run.write_report(t_cfg.report)
                if last or (t_cfg.save_every and step % t_cfg.save_every == 0):
                    ckpt.save_checkpoint(run.path, step, policy.model, policy.tokenizer, {
                        "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
                        "sampler": ahead.sampler_state(step) if ahead else sampler.state_dict(),
                        "history": history,
                    }, keep=t_cfg.keep_checkpoints, extra={**(providers.checkpoint_files() or {}),
                                                           **guard.checkpoint_files()})  # guard_state.json
            progress.close()
        tracker.close()
    scorer.close()  # reward worker processes, if any
    return run.finish(history, step)


def check_supported(alg: AlgorithmConfig, roll_cfg: SamplingConfig, optim_cfg: OptimConfig,
                    reward_cfg: RewardConfig, t_cfg: TrainerConfig | None = None) -> None:
    """Refuse up front, with the capability table's one line, what the embedded backend cannot train."""
    check_correction(alg.correction)
    capabilities.check("embedded", capabilities.facts(alg, roll_cfg, optim=optim_cfg, reward=reward_cfg,
                                                      trainer=t_cfg))


def _engine_metrics(engine) -> dict[str, float]:
    return engine.metrics() if hasattr(engine, "metrics") else {}


def _freeze_heap() -> None:
    """Leave everything alive now (modules, model, tokenizer, servers' clients) out of later garbage collections.

    None of it becomes garbage before the run ends, yet every full collection walked all of it: with
    torch, transformers and the MCP SDK loaded, ~250 ms on the 2-core VM, during which no thread runs
    Python (not the event loop, not the decode thread), five times in 40 steps of the default job, each
    at a random point of some step. After `gc.freeze()` a full collection walks only what the steps made.
    """
    gc.collect()
    gc.freeze()


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _resume(path: Path, policy, optimizer, scheduler, sampler) -> tuple[int, dict]:
    from transformers import AutoModelForCausalLM

    state = ckpt.load_trainer_state(path)
    try:
        if is_lora(policy.model):  # the base is model.path's, unchanged: only the adapter comes back
            load_adapter(policy.model, path)
        else:
            policy.model.load_state_dict(AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).state_dict())
    except (RuntimeError, ValueError) as exc:  # e.g. a built-in model rebuilt for other tool schemas: another vocabulary
        why = str(exc).splitlines()[-1].strip()
        raise ConfigError(f"checkpoint {path} does not fit the model of this config ({why}); did the tools or "
                          "model.path change? Start a new run: trainer.resume=never") from None
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    sampler.load_state_dict(state["sampler"])
    ckpt.set_rng_state(state["rng"])
    if state["step"] <= 0:
        raise ConfigError(f"checkpoint {path} has no step")
    return int(state["step"]), dict(state.get("history", {}))
