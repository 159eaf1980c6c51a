"""Off-policy correction of stale samples: truncated and masked importance sampling (`algorithm.correction`).

With rollouts generated ahead of the update (`trainer.max_staleness`, rl_factory/asynchrony.py), or by an
engine whose numerics differ from the trainer's, the tokens were sampled by a behaviour policy pi_b (the
log-probs the engine recorded, of whichever version sampled each token) that is not the policy pi_old the
update starts from. As in decoupled PPO (AReaL) and verl's rollout correction in decoupled mode, the PPO
ratio is taken against pi_old (the update's own log-probs before its step: exact for one optimizer step per
batch, which the capability table requires) and each token's term is weighted by w = pi_old / pi_b:

- level `token`: w_t = exp(log pi_old(t) - log pi_b(t)); `sequence`: one w per sample, the product over its
  generated tokens, exp(sum_t log-ratio), applied to every token of it.
- `tis` (truncated IS; Yao et al. 2025, "Your Efficient RL Framework Secretly Brings You Off-Policy RL
  Training"): w <- min(w, threshold). verl: rollout_is=<level>, rollout_is_threshold=<threshold>.
- `mis` (masked IS; IcePop, Liu et al. 2025 "When Speed Kills Stability"): w <- w inside
  [1 / threshold, threshold], 0 outside (the token, or the whole sequence, drops out of the gradient and
  stays in the loss's denominator). verl: rollout_is=<level>, rollout_is_threshold="<1/threshold>_<threshold>".

The weights (no gradient) multiply the advantages. For `ppo_clip` this is the same as weighting each
token's loss, since max(-A w r, -A w clip(r)) = w max(-A r, -A clip(r)) for w >= 0.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from rl_factory.algorithms.losses import masked_mean
from rl_factory.base.registry import Registry

# verl's safety bound on a log-ratio before exp (rollout_corr_helper.SAFETY_BOUND)
LOG_RATIO_BOUND = 20.0
LEVELS = ("token", "sequence")


@dataclass
class CorrectionConfig:
    """`algorithm.correction.*`: importance weights pi_old / pi_behaviour for stale samples."""

    # none | tis | mis
    type: str = "none"
    # token | sequence
    level: str = "token"
    # tis: the weights' upper bound; mis: weights outside [1 / threshold, threshold] become 0
    threshold: float = 2.0


WeightFn = Callable[[torch.Tensor, float], tuple[torch.Tensor, torch.Tensor]]
CORRECTIONS: Registry[WeightFn] = Registry("off-policy correction")
register_correction = CORRECTIONS.register


@register_correction("tis")
def truncated_weights(weights: torch.Tensor, threshold: float) -> tuple[torch.Tensor, torch.Tensor]:
    """min(w, threshold); and where it cut."""
    return weights.clamp(max=threshold), weights > threshold


@register_correction("mis")
def masked_weights(weights: torch.Tensor, threshold: float) -> tuple[torch.Tensor, torch.Tensor]:
    """w inside [1 / threshold, threshold], else 0; and where it masked."""
    outside = (weights > threshold) | (weights < 1.0 / threshold)
    return torch.where(outside, torch.zeros_like(weights), weights), outside


def check_correction(cfg: CorrectionConfig) -> None:
    """Unknown names and bad thresholds, in one line (ConfigError)."""
    from rl_factory.base.errors import ConfigError

    if cfg.type != "none":
        CORRECTIONS.lookup(cfg.type)
    if cfg.level not in LEVELS:
        raise ConfigError(f"algorithm.correction.level={cfg.level!r}: expected one of {', '.join(LEVELS)}")
    if not cfg.threshold > 1.0:
        raise ConfigError(f"algorithm.correction.threshold={cfg.threshold}: must be > 1 (a bound on pi_old / pi_b)")


def correct_advantages(cfg: CorrectionConfig, advantages: torch.Tensor, logprobs: torch.Tensor,
                       behaviour: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
    """Advantages weighted by the corrected importance weights, and the weights' metrics.

    Args:
        advantages: [B] or [B,T].
        logprobs: [B,T] pi_old's log-probs (the update's own, before its step).
        behaviour: [B,T] the engine's recorded log-probs.
        mask: [B,T] 1 on generated tokens.
    Returns:
        ([B,T] advantages, {"correction/...": float}).
    """
    mask = mask.to(logprobs.dtype)
    log_ratio = ((logprobs - behaviour) * mask).detach()  # [B,T]
    if cfg.level == "sequence":
        log_ratio = log_ratio.sum(-1, keepdim=True).expand_as(log_ratio)
    raw = torch.exp(log_ratio.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND))
    weights, hit = CORRECTIONS.lookup(cfg.type)(raw, cfg.threshold)
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(-1)
    metrics = {"correction/weight_mean": masked_mean(weights, mask).item(),
               "correction/raw_weight_max": float((raw * mask).max()),
               f"correction/{'truncated' if cfg.type == 'tis' else 'masked'}_fraction":
                   masked_mean(hit.to(mask.dtype), mask).item(),
               "correction/log_ratio_mean": masked_mean((logprobs - behaviour).detach(), mask).item()}
    return advantages * weights * mask, metrics
