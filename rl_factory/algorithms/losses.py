"""Policy losses behind the `POLICY_LOSSES` registry, plus loss aggregation and KL estimators.

A policy loss has one signature, so the trainer resolves a name once and calls it:

    fn(logprobs [B,T], old_logprobs [B,T], advantages [B] or [B,T], mask [B,T], **options)
        -> (loss scalar, metrics dict of floats)

`mask` is the loss mask (1 on generated tokens, 0 on prompt, tool output and padding).

`ppo_clip` is PPO's clipped surrogate (Schulman et al., 2017) with DAPO's decoupled clip range
(`clip_ratio_low` / `clip_ratio_high`, Yu et al., 2025). Departures from verl's "vanilla" loss:
no dual-clip bound for negative advantages (verl's `clip_ratio_c`), and the log-ratio is clamped
to [-20, 20] before `exp` as verl does, so one wild token cannot overflow the ratio.

Aggregation modes (how per-token losses become one scalar; names follow verl with "_"):
- token_mean: mean over every unmasked token of the batch (DAPO); long answers weigh more.
- seq_mean_token_mean: mean per sequence, then over sequences (original GRPO).
- seq_mean_token_sum_norm: token sum per sequence divided by a constant length (T, or
  `norm_length`), then the mean over sequences (Dr. GRPO); removes the length bias of the other
  two. verl divides the summed batch by T only, without the mean over sequences.
"""
from __future__ import annotations

from collections.abc import Callable

import torch

from rl_factory.base.errors import UnknownName
from rl_factory.base.registry import Registry

PolicyLossFn = Callable[..., tuple[torch.Tensor, dict[str, float]]]
POLICY_LOSSES: Registry[PolicyLossFn] = Registry("policy loss")
register_policy_loss, get_policy_loss = POLICY_LOSSES.register, POLICY_LOSSES.lookup


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of `values` [B,T] over positions where `mask` [B,T] is 1; 0 if the mask is empty."""
    return (values * mask).sum() / mask.sum().clamp(min=1)


def _token_mean(loss_mat: torch.Tensor, mask: torch.Tensor,
                norm_length: int | None) -> torch.Tensor:
    return masked_mean(loss_mat, mask)


def _seq_mean_token_mean(loss_mat: torch.Tensor, mask: torch.Tensor,
                         norm_length: int | None) -> torch.Tensor:
    tokens = mask.sum(-1)  # [B]
    seq_loss = (loss_mat * mask).sum(-1) / tokens.clamp(min=1)  # [B]
    has_tokens = (tokens > 0).to(loss_mat.dtype)  # a fully masked row is not a sequence
    return (seq_loss * has_tokens).sum() / has_tokens.sum().clamp(min=1)


def _seq_mean_token_sum_norm(loss_mat: torch.Tensor, mask: torch.Tensor,
                             norm_length: int | None) -> torch.Tensor:
    seq_loss = (loss_mat * mask).sum(-1) / (norm_length or loss_mat.shape[-1])  # [B]
    return seq_loss.mean()


AGGREGATIONS: dict[str, Callable[[torch.Tensor, torch.Tensor, int | None], torch.Tensor]] = {
    "token_mean": _token_mean,
    "seq_mean_token_mean": _seq_mean_token_mean,
    "seq_mean_token_sum_norm": _seq_mean_token_sum_norm,
}


def aggregate_loss(loss_mat: torch.Tensor, mask: torch.Tensor, agg: str = "token_mean",
                   norm_length: int | None = None) -> torch.Tensor:
    """Reduce per-token losses to a scalar (modes in the module docstring).

    Args:
        loss_mat: [B,T] per-token loss.
        mask: [B,T] 1 where the token counts.
        agg: aggregation mode name.
        norm_length: constant divisor for "seq_mean_token_sum_norm" (default T).

    Returns:
        Scalar loss.
    """
    if agg not in AGGREGATIONS:
        raise UnknownName(f"unknown loss aggregation {agg!r}; valid: {sorted(AGGREGATIONS)}")
    return AGGREGATIONS[agg](loss_mat, mask.to(loss_mat.dtype), norm_length)


def ppo_clip_terms(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
                   mask: torch.Tensor, clip_ratio_low: float = 0.2, clip_ratio_high: float = 0.2
                   ) -> tuple[torch.Tensor, dict[str, float]]:
    """Per-token PPO-clip losses [B,T] and their metrics, before aggregation.

    Split from `ppo_clip_loss` so another trainer (verl, which normalizes over the global batch
    across micro-batches and ranks) can aggregate the same per-token losses its own way.
    """
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(-1)  # [B,1] broadcasts over T
    mask = mask.to(logprobs.dtype)
    log_ratio = (logprobs - old_logprobs.detach()).clamp(-20.0, 20.0)  # [B,T]
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    loss_mat = torch.maximum(unclipped, clipped)  # [B,T]
    with torch.no_grad():
        metrics = {
            "clipfrac": masked_mean((clipped > unclipped).to(mask.dtype), mask).item(),
            "approx_kl": masked_mean(-log_ratio, mask).item(),
            "ratio_mean": masked_mean(ratio, mask).item(),
        }
    return loss_mat, metrics


@register_policy_loss("ppo_clip")
def ppo_clip_loss(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
                  mask: torch.Tensor, clip_ratio_low: float = 0.2, clip_ratio_high: float = 0.2,
                  agg: str = "token_mean", norm_length: int | None = None
                  ) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO clipped surrogate: max(-A * r, -A * clip(r, 1 - low, 1 + high)), r = exp(logp - old).

    Args:
        logprobs: [B,T] log-probs of the taken tokens under the current policy (with grad).
        old_logprobs: [B,T] log-probs under the behaviour policy (no grad needed).
        advantages: [B] per sequence (broadcast over tokens) or [B,T] per token.
        mask: [B,T] loss mask.
        clip_ratio_low: the ratio is clipped below at 1 - clip_ratio_low.
        clip_ratio_high: the ratio is clipped above at 1 + clip_ratio_high.
        agg: aggregation mode (see `aggregate_loss`).
        norm_length: see `aggregate_loss`.

    Returns:
        (loss scalar, {"clipfrac", "approx_kl", "ratio_mean"}) where clipfrac is the share of
        tokens whose clipped term is the active one, approx_kl the mean of old - new log-prob
        (verl's ppo_kl), and ratio_mean the mean ratio, all over unmasked tokens.
    """
    loss_mat, metrics = ppo_clip_terms(logprobs, old_logprobs, advantages, mask, clip_ratio_low, clip_ratio_high)
    return aggregate_loss(loss_mat, mask.to(logprobs.dtype), agg, norm_length), metrics


def _k1(log_ratio: torch.Tensor) -> torch.Tensor:
    return log_ratio


def _k2(log_ratio: torch.Tensor) -> torch.Tensor:
    return 0.5 * log_ratio**2


def _low_var_kl(log_ratio: torch.Tensor) -> torch.Tensor:
    # k3 = r - log r - 1 with r = ref/policy: unbiased for KL(policy || ref) and always >= 0.
    # Both clamps follow verl: exp of a large log-ratio would overflow, and rare huge values
    # would otherwise dominate the penalty.
    ref_log_ratio = (-log_ratio).clamp(-20.0, 20.0)
    return (torch.exp(ref_log_ratio) - ref_log_ratio - 1).clamp(-10.0, 10.0)


KL_ESTIMATORS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "k1": _k1,
    "k2": _k2,
    "k3": _low_var_kl,
    "low_var_kl": _low_var_kl,
}


def kl_penalty(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, kind: str = "low_var_kl"
               ) -> torch.Tensor:
    """Per-token KL(policy || reference) estimate from sampled-token log-probs (Schulman's k1-k3).

    Args:
        logprobs: [B,T] current policy log-probs.
        ref_logprobs: [B,T] reference policy log-probs.
        kind: "k1" (logp - ref), "k2" (0.5 (logp - ref)^2), "k3" / "low_var_kl" (clamped k3).

    Returns:
        [B,T] per-token penalty; aggregate it with `aggregate_loss` and the loss mask.
    """
    if kind not in KL_ESTIMATORS:
        raise UnknownName(f"unknown KL estimator {kind!r}; valid: {sorted(KL_ESTIMATORS)}")
    return KL_ESTIMATORS[kind](logprobs - ref_logprobs)


# Per-token forms of the registered losses, for trainers that aggregate across micro-batches and
# ranks themselves (the verl backend): name -> fn(logprobs, old, advantages, mask, low, high).
POLICY_LOSS_TERMS: dict[str, Callable[..., tuple[torch.Tensor, dict[str, float]]]] = {
    "ppo_clip": ppo_clip_terms,
}
