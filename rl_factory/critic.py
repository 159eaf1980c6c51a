"""The embedded backend's critic for `algorithm.advantage=gae`: a value head on the policy's last hidden state.

PPO with GAE (Schulman et al., 2017; 2016) normally trains a separate critic model, which is what the
verl backend does (`critic.type=model`). The embedded critic is a linear layer on the policy's final
hidden state (`critic.type=value_head`), so one forward pass gives both the log-probs and the values,
and the head trains in its own optimizer param group (`critic.lr`). `auto` is each backend's own; the
other backend's name is refused (rl_factory/capabilities.py), as is `vf_coef` on verl.
As in verl, the value of token t is read from the hidden state *before* it (position t-1): the value of
the state in which the token was chosen. Token-level rewards put the outcome reward on a trajectory's
last generated token and each turn's process reward on that turn's last generated token; GAE skips the
masked tool-observation tokens (rl_factory/algorithms/advantages.py). The value loss is verl's clipped
one (`cliprange_value`), weighted by `vf_coef` and averaged over generated tokens.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from rl_factory.algorithms.advantages import VALUE_TARGETS, AdvantageInputs
from rl_factory.base.errors import ConfigError
from rl_factory.providers import Provider, ProviderContext, StepBatch, register_provider
from rl_factory.base.types import Group, Trajectory

log = logging.getLogger("rl_factory")
VALUE_HEAD_FILE = "value_head.pt"
# auto: the backend's own | value_head: the embedded backend's | model: verl's separate critic model
CRITIC_TYPES = ("auto", "value_head", "model")


@dataclass
class CriticConfig:
    """`algorithm.critic.*`: only used by estimators that need values (gae)."""

    type: str = "auto"
    lr: float = 1.0e-3
    cliprange_value: float = 0.5
    vf_coef: float = 0.5


class ValueHead(nn.Module):
    """hidden [B, T, H] -> values [B, T], shifted so column t is the value of the state before token t."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.linear = nn.Linear(hidden_size, 1)
        nn.init.zeros_(self.linear.weight)  # start at V = 0: the first advantages are the raw returns
        nn.init.zeros_(self.linear.bias)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        values = self.linear(hidden.float()).squeeze(-1)
        return torch.cat([torch.zeros_like(values[:, :1]), values[:, :-1]], dim=1)


def check_critic_type(cfg: CriticConfig) -> None:
    """An unknown `critic.type` lists the valid ones (which backend takes which: rl_factory/capabilities.py)."""
    if cfg.type not in CRITIC_TYPES:
        raise ConfigError(f"algorithm.critic.type: unknown critic {cfg.type!r} (valid: {', '.join(CRITIC_TYPES)})")


def build_value_head(cfg: CriticConfig, model) -> ValueHead:
    check_critic_type(cfg)
    return ValueHead(model.config.hidden_size).to(next(model.parameters()).device)


def load_value_head(head: ValueHead, checkpoint: Path) -> None:
    path = checkpoint / VALUE_HEAD_FILE
    if not path.exists():
        raise FileNotFoundError(f"checkpoint {checkpoint} has no {VALUE_HEAD_FILE} (was it trained without a critic?)")
    head.load_state_dict(torch.load(path, map_location=next(head.parameters()).device))


def token_rewards(traj: Trajectory) -> list[float]:
    """Rewards aligned with `traj.token_ids`: each turn's process reward on its last generated token,
    plus the outcome reward on the last generated token of the trajectory."""
    rewards = [0.0] * len(traj.token_ids)
    ends = turn_end_positions(traj)
    for pos, r in zip(ends, traj.process_rewards):
        rewards[pos] += r
    if ends:
        rewards[ends[-1]] += float(traj.reward or 0.0)
    return rewards


def turn_end_positions(traj: Trajectory) -> list[int]:
    """Index in `traj.token_ids` of each turn's last generated token (the append context policy)."""
    ends, pos = [], len(traj.prompt_ids)
    for turn in traj.turns:
        pos += len(turn.generated_ids)
        if turn.generated_ids:
            ends.append(pos - 1)
        pos += len(turn.observation_ids)
    return ends


@torch.no_grad()
def compute_values(policy, head: ValueHead, trajs: list[Trajectory], micro_batch_size: int) -> list[list[float]]:
    """Values of every token of every trajectory under the current critic (no grad)."""
    out: list[list[float]] = []
    policy.model.eval()
    for start in range(0, len(trajs), micro_batch_size):
        micro = trajs[start: start + micro_batch_size]
        width = max(len(t.token_ids) for t in micro)
        ids = torch.full((len(micro), width), policy.tokenizer.pad_token_id, dtype=torch.long)
        attention = torch.zeros_like(ids)
        for i, t in enumerate(micro):
            ids[i, :len(t.token_ids)] = torch.tensor(t.token_ids)
            attention[i, :len(t.token_ids)] = 1
        hidden = policy.hidden_states(ids.to(policy.device), attention.to(policy.device))
        values = head(hidden).cpu()
        out.extend(values[i, :len(t.token_ids)].tolist() for i, t in enumerate(micro))
    return out


def critic_targets(trajs: list[Trajectory], values: torch.Tensor, returns: torch.Tensor,
                   mask: torch.Tensor) -> dict[str, float]:
    """The critic's inputs of the update onto each trajectory, `old_values` and `returns` (aligned with
    token_ids, 0 off generated tokens); returns the critic/* metrics."""
    for i, t in enumerate(trajs):
        n = len(t.token_ids)
        t.old_values, t.returns = values[i, :n].tolist(), returns[i, :n].tolist()
    return {"critic/values_mean": float((values * mask).sum() / mask.sum().clamp(min=1)),
            "critic/returns_mean": float(returns.sum() / mask.sum().clamp(min=1)),
            "critic/vf_explained_var": explained_variance(values, returns, mask)}


def assign_with_critic(advantage: str, trajs: list[Trajectory], values: list[list[float]],
                       **options: Any) -> dict[str, float]:
    """The trainer's step 5 (rl_factory/providers.py) over `trajs` with these values instead of the head's:
    estimator `advantage` (one with critic targets) gives each trajectory its token advantages, `old_values`
    and `returns`; returns critic/* metrics. Each trajectory is its own group (a critic reads no group)."""
    from rl_factory.providers import build_providers
    from rl_factory.update import AlgorithmConfig

    providers = build_providers(ProviderContext(AlgorithmConfig(advantage=advantage)))
    providers.by_input["values"].given = values
    return providers.assign([Group(t.sample_index, [t]) for t in trajs], None, options)


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> float:
    """1 - Var(returns - values) / Var(returns) over the masked tokens (1 = perfect critic)."""
    n = mask.sum().clamp(min=1)
    def var(x):
        mean = (x * mask).sum() / n
        return ((x - mean) ** 2 * mask).sum() / n
    denom = var(returns)
    return float(1 - var(returns - values) / denom) if denom > 1e-12 else 0.0


def value_loss(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor,
               cliprange_value: float) -> tuple[torch.Tensor, dict[str, float]]:
    """verl's clipped value loss: 0.5 * max((v - R)^2, (clip(v, v_old +- c) - R)^2), token mean."""
    clipped = old_values + (values - old_values).clamp(-cliprange_value, cliprange_value)
    losses = torch.max((values - returns) ** 2, (clipped - returns) ** 2)
    n = mask.sum().clamp(min=1)
    loss = 0.5 * (losses * mask).sum() / n
    clipfrac = (((clipped - returns) ** 2 > (values - returns) ** 2).float() * mask).sum() / n
    return loss, {"value_loss": float(loss.detach()), "vf_clipfrac": float(clipfrac)}


class ValueLoss:
    """The update's value-loss term (rl_factory/update.py `LossTerm`): verl's clipped loss on the head's values
    of the update's forward, times `vf_coef`; the head's gradient is clipped on its own, as a separate
    critic model's would be."""

    needs_hidden = True  # the head reads the policy's last hidden state
    trains_every_sample = True  # token advantages are rarely all 0, and the critic learns from every sample
    grad_norm_key = "critic/grad_norm"

    def __init__(self, head: ValueHead, cfg: CriticConfig):
        self.head, self.cfg = head, cfg

    def parameters(self) -> list[nn.Parameter]:
        return list(self.head.parameters())

    def __call__(self, policy, batch: dict[str, torch.Tensor], packed, logprobs: torch.Tensor,
                 hidden: torch.Tensor | None) -> tuple[torch.Tensor, dict[str, float]]:
        vf_loss, stats = value_loss(self.head(hidden), batch["old_values"], batch["returns"], batch["loss_mask"],
                                    self.cfg.cliprange_value)
        return self.cfg.vf_coef * vf_loss, {f"critic/{k}": v for k, v in stats.items()}


@register_provider("values")
class Critic(Provider):
    """`values`: the value head (`algorithm.critic`) values every token of the step's kept trajectories
    before the update, and learns from the estimator's targets through the value-loss term."""

    def __init__(self, ctx: ProviderContext):
        super().__init__(ctx)
        check_critic_type(ctx.alg.critic)
        if ctx.alg.advantage not in VALUE_TARGETS:
            raise ConfigError(f"algorithm.advantage: {ctx.alg.advantage!r} reads critic values but gives the critic "
                              "no targets (rl_factory/algorithms/advantages.py VALUE_TARGETS)")
        self.head: ValueHead | None = None
        self.policy = None
        self.given: list[list[float]] | None = None  # values computed elsewhere (assign_with_critic)

    def attach(self, policy) -> None:
        self.policy, self.head = policy, build_value_head(self.ctx.alg.critic, policy.model)

    def param_groups(self) -> list[dict[str, Any]]:  # the critic learns at its own rate
        return [{"params": list(self.head.parameters()), "lr": self.ctx.alg.critic.lr}]

    def load(self, checkpoint: Path) -> None:
        load_value_head(self.head, checkpoint)
        log.info("restored the value head from %s", checkpoint / VALUE_HEAD_FILE)

    def checkpoint_files(self) -> dict[str, Any]:
        return {VALUE_HEAD_FILE: self.head.state_dict()}

    def fill(self, batch: StepBatch) -> torch.Tensor:
        values = self.given
        if values is None:
            values = compute_values(self.policy, self.head, batch.trajs, self.ctx.optim.micro_batch_size)
        return batch.pad(values)

    def after(self, batch: StepBatch, inputs: AdvantageInputs, advantages: torch.Tensor,
              targets: torch.Tensor | None) -> dict[str, float]:
        return critic_targets(batch.trajs, inputs.values, targets, inputs.response_mask)

    def loss_terms(self) -> list[ValueLoss]:
        return [ValueLoss(self.head, self.ctx.alg.critic)] if self.head is not None else []
