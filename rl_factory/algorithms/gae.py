"""`gae`: generalized advantage estimation over the generated tokens, and the critic's targets (its `VALUE_TARGETS`).

Registered in `rl_factory.algorithms.advantages.ADVANTAGES` (which imports this module); the departures
from the paper are listed there.
"""
from __future__ import annotations

import torch

from rl_factory.algorithms.advantages import VALUE_TARGETS, AdvantageInputs, estimate, register_advantage, whiten


@register_advantage("gae", requires=("values", "response_mask"), uses=("token_rewards",))
def compute_gae_advantage(inputs: AdvantageInputs, gamma: float = 1.0, lam: float = 1.0,
                          whiten_advantages: bool = True) -> torch.Tensor:
    """Generalized advantage estimation over the masked (generated) tokens.

    Args:
        inputs: values [N, T], response_mask [N, T], and token_rewards [N, T] (default: each
            trajectory's reward on its last masked token).
        gamma: discount per generated token.
        lam: GAE lambda.
        whiten_advantages: whiten over all masked tokens of the batch (verl does).

    Returns:
        [N, T] advantages, 0 on masked-out positions. The critic's targets are the unwhitened
        advantages plus `values`.
    """
    mask, values = inputs.response_mask, inputs.values
    token_rewards = inputs.token_rewards
    if token_rewards is None:
        token_rewards = outcome_token_rewards(inputs.rewards, mask)
    next_value = torch.zeros_like(values[:, 0])  # [N]
    running = torch.zeros_like(values[:, 0])  # [N]
    advantages = torch.zeros_like(values)
    for t in reversed(range(values.shape[1])):
        delta = token_rewards[:, t] + gamma * next_value - values[:, t]
        candidate = delta + gamma * lam * running
        # A masked position (prompt, tool output, padding) neither ends nor extends the TD chain.
        m = mask[:, t]
        next_value = m * values[:, t] + (1 - m) * next_value
        running = m * candidate + (1 - m) * running
        advantages[:, t] = running
    if whiten_advantages:
        advantages = whiten(advantages, mask)
    return advantages * mask


def outcome_token_rewards(rewards: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[N, T] zeros with rewards [N] on each row's last masked token (rows without one get none)."""
    positions = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)
    last = torch.where(mask > 0, positions, torch.full_like(positions, -1)).max(-1).values  # [N]
    token_rewards = torch.zeros_like(mask, dtype=rewards.dtype)
    rows = (last >= 0).nonzero()[:, 0]
    token_rewards[rows, last[rows]] = rewards[rows]
    return token_rewards


def gae_targets(inputs: AdvantageInputs, gamma: float = 1.0, lam: float = 1.0,
                whiten_advantages: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """gae's advantages [N, T] and the critic's targets [N, T]: the unwhitened advantages plus the values
    (verl's returns), 0 off the masked tokens; the advantages whitened over the masked tokens by default."""
    raw = estimate("gae", inputs, gamma=gamma, lam=lam, whiten_advantages=False)
    mask = inputs.response_mask
    returns = (raw + inputs.values) * mask
    return (whiten(raw, mask) * mask if whiten_advantages else raw), returns


VALUE_TARGETS["gae"] = gae_targets
