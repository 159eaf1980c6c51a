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

from rl_factory import capabilities
from rl_factory.backends.verl import supported
from rl_factory.backends.verl.plugin import OLD_LOG_PROBS_ENV as MODE_ENV  # read by our loss in the actor workers
from rl_factory.config import ConfigError
from rl_factory.update import OldLogProbs

BYPASS_KEY = "algorithm.rollout_correction.bypass_mode"
MODES = get_args(OldLogProbs)


def resolve(cfg: DictConfig, requested: str, given: set[str]) -> tuple[str, str]:
    """(mode, why) for the composed verl config `cfg`; `given` = the verl keys set on the command line.

    A mode that would be inexact here is refused by the capability table (rl_factory/capabilities.py)."""
    if requested not in MODES:
        raise ConfigError(f"algorithm.old_log_probs={requested!r}: expected one of {', '.join(MODES)}")
    corr = cfg.algorithm.get("rollout_correction") or {}
    if BYPASS_KEY in given:  # the user drives verl's switch themselves
        capabilities.check("verl", {"algorithm.old_log_probs": requested, BYPASS_KEY: bool(corr.get("bypass_mode"))})
        return ("rollout" if corr.get("bypass_mode") else "recompute"), f"{BYPASS_KEY} given on the command line"
    facts = supported.verl_facts(cfg)
    capabilities.check("verl", {"algorithm.old_log_probs": requested, **facts})
    if requested != "auto":
        return requested, "asked for"
    if not cfg.trainer.use_v1:
        return "recompute", "verl's legacy trainer (trainer.use_v1=false) replaces our loss in bypass mode"
    if facts["algorithm.rollout_correction"]:
        key = facts["algorithm.rollout_correction"]
        return "recompute", f"verl's rollout correction (algorithm.rollout_correction.{key}) needs it"
    if facts["trainer.max_staleness"] != 0:  # the update's own log-probs would ignore who sampled the tokens
        return "rollout", (f"verl's {cfg.trainer.v1.trainer_mode} trainer: the PPO ratio against the behaviour "
                           "policy (vLLM's sampling log-probs)")
    if facts[capabilities.OPTIMIZER_STEPS] != 1:
        return "recompute", "several optimizer steps per batch (ppo_epochs or mini-batches > 1)"
    return "update", "one optimizer step per batch: the update's own forward gives the same log-probs"


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


def resolved(cfg: DictConfig) -> str:
    """The mode `apply` wrote into `cfg`."""
    return str(OmegaConf.select(cfg, f"ray_kwargs.ray_init.runtime_env.env_vars.{MODE_ENV}"))
