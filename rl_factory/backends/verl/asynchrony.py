"""Async training and off-policy correction on verl: our keys onto verl 0.9.1's own V1 async trainers.

Nothing here runs generation or training; it maps settings (no engine of our own on verl):
- `trainer.max_staleness=k` > 0 -> `trainer.v1.trainer_mode=colocate_async` (a raw
  `trainer.v1.trainer_mode=separate_async` wins: rollout on GPUs of its own), with verl's replay buffer
  bounding the staleness: `trainer.v1.sampler.max_off_policy_threshold=k+1` (verl counts the versions a
  trajectory *spans*, i.e. staleness + 1) and `max_off_policy_strategy=wait` (dropless: a prompt that reaches
  the bound is waited for and trained, never dropped, so every prompt of an epoch trains once);
  `num_warmup_batches=k` (batches generated before the first update: how far generation runs ahead).
  verl's async trainers abort running requests at a weight update and resume them under the new weights
  (partial rollouts, `FullyAsyncLLMServerClient`), so `trainer.partial_rollouts=false` is refused (the
  capability table). k = 0 adds no key: verl's `sync` mode, as without this module.
- `separate_async` syncs weights every `parameter_sync_step` mini-batches and asserts that
  `train_batch_size == parameter_sync_step * ppo_mini_batch_size`: set to `optim.mini_batches` (one sync per
  training step, the step of our version count).
- `algorithm.correction` -> verl's `algorithm.rollout_correction` (decoupled mode: verl recomputes pi_old,
  `algorithm.old_log_probs` resolves to recompute): `tis` = `rollout_is=<level>`,
  `rollout_is_threshold=<threshold>`; `mis` = `rollout_is=<level>` with verl's two-sided
  `rollout_is_threshold="<1/threshold>_<threshold>"` (weights outside become 0, as ours).

Our agent loop, filters and ArenaRL run unchanged: verl dispatches a prompt's n sessions together and an
aborted request resumes inside the same agent-loop coroutine, so a group's sessions still meet in their
AgentLoopWorker (group.py) before any is returned.
"""
from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, OmegaConf

ASYNC_MODES = ("colocate_async", "separate_async")


def async_values(ours: Any) -> dict[str, Any]:
    """verl key -> value for `trainer.max_staleness` and `algorithm.correction` (none: no key), from our
    parsed config (`RunConfig`)."""
    values: dict[str, Any] = {}
    k = int(ours.trainer.max_staleness)
    if k > 0:
        values.update({
            "trainer.v1.trainer_mode": "colocate_async",
            "trainer.v1.colocate_async.num_warmup_batches": k,
            "trainer.v1.separate_async.num_warmup_batches": k,
            "trainer.v1.separate_async.parameter_sync_step": int(ours.optim.mini_batches),
            "trainer.v1.sampler.max_off_policy_threshold": k + 1,
            "trainer.v1.sampler.max_off_policy_strategy": "wait",
        })
    correction = ours.algorithm.correction
    if correction.type != "none":
        threshold = float(correction.threshold)
        values.update({
            "algorithm.rollout_correction.rollout_is": correction.level,
            "algorithm.rollout_correction.rollout_is_threshold":
                threshold if correction.type == "tis" else f"{1.0 / threshold}_{threshold}",
        })
    return values


def batches_in_flight(cfg: DictConfig) -> float:
    """Batches verl's rollout decodes at once: the step's own, and under an async trainer its warm-up batches
    (`num_warmup_batches`, queued beside it at the start and refilled after every step)."""
    mode = OmegaConf.select(cfg, "trainer.v1.trainer_mode")
    if mode not in ASYNC_MODES:
        return 1.0
    return 1.0 + max(0.0, float(OmegaConf.select(cfg, f"trainer.v1.{mode}.num_warmup_batches") or 0))


def staleness(cfg: DictConfig) -> int | str:
    """The staleness bound of verl's composed config: 0 in sync mode, else the replay buffer's (threshold - 1)."""
    v1 = cfg.trainer.v1
    if v1.trainer_mode not in ASYNC_MODES:
        return 0
    threshold = v1.sampler.max_off_policy_threshold
    return "unbounded" if threshold is None else int(threshold) - 1
