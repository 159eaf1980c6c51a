"""Where the PPO ratio's denominator comes from on verl: `algorithm.old_log_probs`.

verl's trainer runs a forward pass of the whole batch before every update (`old_log_prob`, 0.6-1.1 s a
step of the 0.6B shape on one H200, 2026-12-01) to get the log-probs of the policy that sampled it. When
the step takes exactly one optimizer step (one epoch, one mini-batch) that forward computes, with the
same weights, what the update's own forward computes a moment later: the ratio is 1 at every token,
nothing is clipped, and the gradient is the plain policy gradient. TRL's GRPOTrainer skips the pass in
that case for the same reason (`old_per_token_logps = per_token_logps.detach()`).

Modes (`configs/grpo.yaml`, algorithm.old_log_probs):
- `update`: the update's own log-probs, detached, are the old ones. verl's V1 trainer is told to skip its
  forward (`algorithm.rollout_correction.bypass_mode=true`: it copies vLLM's sampling log-probs into
  `old_log_probs` instead), and our registered policy loss (plugin.py) replaces them with the update's
  detached log-probs, reporting how far vLLM's were from them (`actor/rollout_probs_diff_mean`: what the
  skipped pass would have logged as `training/rollout_probs_diff_mean`). Only valid for one optimizer step
  per batch.
- `rollout`: vLLM's sampling log-probs are the old ones (verl's bypass mode, our loss unchanged): the
  ratio then also carries vLLM's numerical difference from the trainer's forward.
- `recompute`: verl's forward pass (verl's default); needed for several epochs or mini-batches, and by
  verl's rollout correction (`algorithm.rollout_correction.rollout_is` / `rollout_rs`).
- `auto` (default): `update` where it is exact, else `recompute`.

Only verl's V1 trainer (`trainer.use_v1=true`, the default) keeps our loss in bypass mode; the legacy
trainer swaps in its own `bypass_mode` loss, so there `auto` recomputes and the other two are refused.
"""
from __future__ import annotations

from typing import Any, get_args

from omegaconf import DictConfig, OmegaConf

from rl_factory.backends.verl.plugin import OLD_LOG_PROBS_ENV as MODE_ENV  # read by our loss in the actor workers
from rl_factory.config import ConfigError
from rl_factory.update import OldLogProbs

BYPASS_KEY = "algorithm.rollout_correction.bypass_mode"
MODES = get_args(OldLogProbs)


def one_optimizer_step(cfg: DictConfig) -> bool:
    """One epoch over one mini-batch: the weights the update reads are the ones that sampled."""
    actor = cfg.actor_rollout_ref.actor
    return int(actor.ppo_epochs) == 1 and int(actor.ppo_mini_batch_size) >= int(cfg.data.train_batch_size)


def resolve(cfg: DictConfig, requested: str, given: set[str]) -> tuple[str, str]:
    """(mode, why) for the composed verl config `cfg`; `given` = the verl keys set on the command line."""
    if requested not in MODES:
        raise ConfigError(f"algorithm.old_log_probs={requested!r}: expected one of {', '.join(MODES)}")
    corr = cfg.algorithm.get("rollout_correction") or {}
    correction = [k for k in ("rollout_is", "rollout_rs") if corr.get(k) is not None]
    if BYPASS_KEY in given:  # the user drives verl's switch themselves
        mode = "rollout" if corr.get("bypass_mode") else "recompute"
        if requested not in ("auto", mode):
            raise ConfigError(f"algorithm.old_log_probs={requested} contradicts {BYPASS_KEY}="
                              f"{corr.get('bypass_mode')} on the command line: set one of them")
        return mode, f"{BYPASS_KEY} given on the command line"
    one_step = one_optimizer_step(cfg)
    if requested == "auto":
        if not cfg.trainer.use_v1:
            return "recompute", "verl's legacy trainer (trainer.use_v1=false) replaces our loss in bypass mode"
        if correction:
            return "recompute", f"verl's rollout correction (algorithm.rollout_correction.{correction[0]}) needs it"
        if not one_step:
            return "recompute", "several optimizer steps per batch (ppo_epochs or mini-batches > 1)"
        return "update", "one optimizer step per batch: the update's own forward gives the same log-probs"
    if requested == "recompute":
        return "recompute", "asked for"
    if not cfg.trainer.use_v1:
        raise ConfigError(f"algorithm.old_log_probs={requested} needs verl's V1 trainer (trainer.use_v1=true): the "
                          "legacy trainer replaces our policy loss in bypass mode")
    if correction:
        raise ConfigError(f"algorithm.old_log_probs={requested} skips the pass verl's rollout correction needs "
                          f"(algorithm.rollout_correction.{correction[0]} is set): use recompute")
    if requested == "update" and not one_step:
        actor = cfg.actor_rollout_ref.actor
        raise ConfigError("algorithm.old_log_probs=update needs one optimizer step per batch (optim.ppo_epochs=1, "
                          f"optim.mini_batches=1); got ppo_epochs={actor.ppo_epochs}, ppo_mini_batch_size="
                          f"{actor.ppo_mini_batch_size} of train_batch_size={cfg.data.train_batch_size}: use recompute")
    return requested, "asked for"


def apply(cfg: DictConfig, requested: str, given: set[str]) -> str:
    """Resolve the mode and write verl's keys for it into `cfg`; returns a line for the log."""
    mode, why = resolve(cfg, requested, given)
    values: dict[str, Any] = {}
    if BYPASS_KEY not in given:
        values[BYPASS_KEY] = mode in ("update", "rollout")
    # always set, so a value left in the user's shell cannot reach the workers' loss instead
    values[f"ray_kwargs.ray_init.runtime_env.env_vars.{MODE_ENV}"] = mode
    for key, value in values.items():
        OmegaConf.update(cfg, key, value, merge=False, force_add=True)
    return f"old log-probs: {mode} ({why})"
