"""The policy-gradient update over one step's trajectories (mini-batches, micro-batches, KL).

Micro-batches are runs of similar length under a token budget (`optim.micro_batch_tokens`), cut
where padding plus a per-micro-batch cost is least, each padded to its own longest sample only: one
long trajectory costs about its own tokens, not a widening of its neighbours, so step time follows
the tokens trained rather than the longest trajectory.

Trajectories whose advantage is exactly 0 (a GRPO group where every rollout got the same reward)
contribute no policy gradient, so they are not computed unless a KL penalty needs them; they still
count in the loss's denominator, so skipping them often halves the cost of an update on CPU without
changing it. A mini-batch with none to compute takes no optimizer step (the warmup counts steps taken).

Beyond the policy loss, the loss is a list of terms (`LossTerm`), added in order: the KL penalty to the
frozen reference (`KLPenalty`, only when `kl_coef > 0`; aggregated with the same `loss_agg` mode as the
policy loss, as verl's `agg_loss` does), then each estimator input provider's (the critic's value loss,
rl_factory/critic.py `ValueLoss`). A term that trains every sample makes the zero-advantage ones computed
too; a term with parameters of its own has their gradient clipped apart from the policy's.

An optimizer step whose loss or gradient norm is not finite is skipped (its gradients dropped, the
weights and the optimizer state untouched) and counted in `update/skipped_nonfinite`: one NaN
gradient would otherwise make every weight NaN. `optim.max_nonfinite_steps` such steps in a row
stop the run (`NonFiniteUpdates`, one line): the model is diverging, not hitting a stray batch.

`actor/logprob_gap` is the mean |training - sampling| log-prob of the trained tokens before the update's
first optimizer step (numerics alone: the weights that sampled), `actor/logprob_gap_stale` after it; the
run guard's `logprob_gap` check watches both (rl_factory/guard).
"""
from __future__ import annotations

import copy
import math
import random
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Literal, Protocol

import torch

from rl_factory import capabilities
from rl_factory.algorithms.correction import CorrectionConfig, correct_advantages
from rl_factory.group_arena import ArenaConfig
from rl_factory.algorithms.losses import aggregate_loss, get_policy_loss, kl_penalty
from rl_factory.critic import CriticConfig
from rl_factory.base.errors import UserError
from rl_factory.packing import MASK_KINDS, attention_cost_ratio, build_packs, pack_inputs
from rl_factory.base.types import Trajectory


# algorithm.old_log_probs: where the PPO ratio's denominator comes from (README: "Old log-probs")
OldLogProbs = Literal["auto", "update", "rollout", "recompute"]


@dataclass
class AlgorithmConfig:
    """`algorithm.*`: estimator, policy loss and KL."""

    advantage: str = "grpo"
    advantage_options: dict[str, Any] = field(default_factory=dict)
    policy_loss: str = "ppo_clip"
    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.2
    loss_agg: str = "token_mean"
    old_log_probs: OldLogProbs = "auto"
    kl_coef: float = 0.0
    kl_kind: str = "low_var_kl"
    arena: ArenaConfig = field(default_factory=ArenaConfig)
    critic: CriticConfig = field(default_factory=CriticConfig)
    correction: CorrectionConfig = field(default_factory=CorrectionConfig)


@dataclass
class OptimConfig:
    """`optim.*`: optimizer and batching of the update."""

    lr: float = 3.0e-4
    weight_decay: float = 0.0
    warmup_steps: int = 3
    grad_clip: float = 1.0
    ppo_epochs: int = 1
    mini_batches: int = 1
    micro_batch_size: int = 64
    # Padded tokens (rows x longest row) per forward/backward; None = rows only (micro_batch_size)
    micro_batch_tokens: int | None = 8192
    # A prompt's samples computed as one packed row of their prefix tree, what they share once
    # (rl_factory/packing.py); models that cannot take the packed mask fall back to plain rows
    shared_prefix: bool = True
    # Optimizer steps in a row whose loss or gradient norm is not finite before the run stops (each skipped)
    max_nonfinite_steps: int = 3


class NonFiniteUpdates(UserError):
    """Too many optimizer steps in a row had a non-finite loss or gradient norm."""


class NonFiniteGuard:
    """Counts optimizer steps skipped for a non-finite loss or gradient norm; one per run, so a streak
    spans training steps."""

    def __init__(self, limit: int = 3):
        self.limit, self.in_a_row, self.skipped = max(1, limit), 0, 0

    def allows(self, losses: list[float], grad_norms: list[float]) -> bool:
        """Whether the optimizer may step; raises NonFiniteUpdates after `limit` refusals in a row."""
        bad = [v for v in (*losses, *grad_norms) if not math.isfinite(v)]
        if not bad:
            self.in_a_row = 0
            return True
        self.in_a_row += 1
        self.skipped += 1
        if self.in_a_row >= self.limit:
            raise NonFiniteUpdates(
                f"{self.in_a_row} optimizer steps in a row had a non-finite loss or gradient norm ({bad[0]}); each "
                "was skipped, the weights are unchanged. Stopping: lower optim.lr, check the rewards and advantages "
                "(rollouts/), or raise optim.max_nonfinite_steps")
        return False


def _length(sample) -> int:
    return len(sample.token_ids)


def _one(_) -> int:
    return 1


# What one more micro-batch costs beyond its padded tokens (a forward/backward's fixed work), in tokens:
# on the 2-core VM the tiny model's forward+backward takes ~4 ms plus ~45 us per padded token.
MICRO_BATCH_COST_TOKENS = 96


def micro_batches(items: list, max_rows: int, max_tokens: int | None, width: Callable[[Any], int] = _length,
                  size: Callable[[Any], int] = _one) -> list[list]:
    """Split a mini-batch into micro-batches of similar width, each padded only to its own widest item:
    at most `max_rows` samples (an item holds `size(item)`: a pack several) and `max_tokens` padded
    tokens (items x widest) per micro-batch.

    Items are sorted by width (stable, so the split is a function of the items alone) and cut into
    runs where the padded tokens plus `MICRO_BATCH_COST_TOKENS` per micro-batch are least (an exact
    search over the cut points). Filling each micro-batch up to the budget instead lets a long
    trajectory widen the short ones that still fit beside it (24 rows of ~107 tokens padded to 317).
    An item wider than `max_tokens`, or holding more than `max_rows` samples, gets a micro-batch of its own.
    """
    order = sorted(items, key=width)
    widths, sizes = [width(x) for x in order], [size(x) for x in order]
    # best[end]: least cost of order[:end]; cut[end]: where its last micro-batch starts
    best, cut = [0] + [None] * len(order), [0] * (len(order) + 1)
    for end in range(1, len(order) + 1):
        widest, count = widths[end - 1], 0  # the widest of any micro-batch ending here
        for start in range(end - 1, -1, -1):
            rows, count = end - start, count + sizes[start]
            if rows > 1 and (count > max_rows or (max_tokens is not None and rows * widest > max_tokens)):
                break  # more rows only pad more
            cost = best[start] + rows * widest + MICRO_BATCH_COST_TOKENS
            if best[end] is None or cost < best[end]:
                best[end], cut[end] = cost, start
    out, end = [], len(order)
    while end:
        out.append(order[cut[end]:end])
        end = cut[end]
    return out[::-1]


def collate(trajs: list[Trajectory], pad_id: int, device: torch.device) -> dict[str, torch.Tensor]:
    """Right-pad trajectories into tensors: ids/attention/loss mask/old log-probs [B, T], advantages [B].

    Trajectories carrying `token_advantages` (token-level estimators) give advantages [B, T], plus
    old_values/returns [B, T] where a critic set them.
    """
    width = max(len(t.token_ids) for t in trajs)
    rows = len(trajs)
    batch = {
        "input_ids": torch.full((rows, width), pad_id, dtype=torch.long),
        "attention_mask": torch.zeros((rows, width), dtype=torch.long),
        "loss_mask": torch.zeros((rows, width), dtype=torch.float32),
        "old_logprobs": torch.zeros((rows, width), dtype=torch.float32),
    }
    for i, t in enumerate(trajs):
        n = len(t.token_ids)
        batch["input_ids"][i, :n] = torch.tensor(t.token_ids)
        batch["attention_mask"][i, :n] = 1
        batch["loss_mask"][i, :n] = torch.tensor(t.loss_mask, dtype=torch.float32)
        batch["old_logprobs"][i, :n] = torch.tensor(t.logprobs, dtype=torch.float32)
    if getattr(trajs[0], "token_advantages", None) is not None:
        critic = getattr(trajs[0], "returns", None) is not None
        for key, attr in (("advantages", "token_advantages"), ("old_values", "old_values"), ("returns", "returns")):
            if key != "advantages" and not critic:
                continue
            batch[key] = torch.zeros((rows, width), dtype=torch.float32)
            for i, t in enumerate(trajs):
                batch[key][i, :len(t.token_ids)] = torch.tensor(getattr(t, attr), dtype=torch.float32)
    else:
        batch["advantages"] = torch.tensor([t.advantage for t in trajs], dtype=torch.float32)
    return {k: v.to(device) for k, v in batch.items()}


class LossTerm(Protocol):
    """One extra term of the update's loss: `term(policy, batch, packed, logprobs, hidden) -> (weighted loss,
    metrics)` per micro-batch. Metric keys are prefixed `actor/` unless they start with `critic/`."""

    needs_hidden: bool  # it reads the policy's last hidden states of the update's forward
    trains_every_sample: bool  # a sample whose advantage is 0 still has a gradient through it
    grad_norm_key: str | None  # with parameters of its own: their clipped gradient norm's metric

    def parameters(self) -> list[torch.nn.Parameter]: ...

    def __call__(self, policy, batch: dict[str, torch.Tensor], packed: dict | None, logprobs: torch.Tensor,
                 hidden: torch.Tensor | None) -> tuple[torch.Tensor, dict[str, float]]: ...


class KLPenalty:
    """`kl_coef` x KL(policy || frozen reference), aggregated like the policy loss (`loss_agg`)."""

    needs_hidden = False
    trains_every_sample = True
    grad_norm_key = None

    def __init__(self, ref_model, alg: AlgorithmConfig):
        self.ref_model, self.alg = ref_model, alg

    def parameters(self) -> list[torch.nn.Parameter]:
        return []  # the reference is frozen

    def __call__(self, policy, batch, packed, logprobs, hidden):
        with torch.no_grad():
            ref, _ = _logprobs(policy, batch, packed, model=self.ref_model)
        kl = aggregate_loss(kl_penalty(logprobs, ref, kind=self.alg.kl_kind), batch["loss_mask"], self.alg.loss_agg)
        return self.alg.kl_coef * kl, {"kl": float(kl.detach())}


def loss_terms(alg: AlgorithmConfig, ref_model=None, extra: list[LossTerm] | tuple = ()) -> list[LossTerm]:
    """The update's extra loss terms in the order they add: the KL penalty (with `kl_coef > 0`), then `extra`
    (the estimator input providers', rl_factory/providers.py)."""
    if alg.kl_coef > 0 and ref_model is None:
        raise ValueError(f"algorithm.kl_coef={alg.kl_coef} needs a reference model (see load_reference)")
    return [*([KLPenalty(ref_model, alg)] if alg.kl_coef > 0 else []), *extra]


def load_reference(model, alg: AlgorithmConfig):
    """A frozen copy of `model` for the KL penalty, or None (nothing copied) when `alg.kl_coef` is 0."""
    if alg.kl_coef <= 0:
        return None
    ref = copy.deepcopy(model).eval()
    for p in ref.parameters():
        p.requires_grad_(False)
    return ref


def old_log_probs_mode(alg: AlgorithmConfig, optim: OptimConfig) -> str:
    """`algorithm.old_log_probs` on the embedded backend: `rollout` (auto) or `update`.

    The engine samples with the weights being trained, in the same process, so the log-probs it
    recorded at each sampled token are the policy's: no pass of its own is needed before the update.
    """
    capabilities.check("embedded", {"algorithm.old_log_probs": alg.old_log_probs,
                                    "algorithm.correction.type": alg.correction.type,
                                    capabilities.OPTIMIZER_STEPS: optim.ppo_epochs * optim.mini_batches})
    # an off-policy correction takes the ratio against pi_old, the update's own (algorithms/correction.py)
    return "update" if alg.old_log_probs == "update" or alg.correction.type != "none" else "rollout"


def update_policy(policy, optimizer, scheduler, trajs: list[Trajectory], alg: AlgorithmConfig,
                  optim: OptimConfig, ref_model=None, seed: int = 0, terms: list[LossTerm] | tuple = (),
                  guard: NonFiniteGuard | None = None) -> dict[str, float]:
    """PPO-style epochs of mini-batch updates; returns averaged loss/clip/KL/grad-norm metrics.

    The KL penalty (`ref_model`, with `alg.kl_coef > 0`) and `terms` (the providers' extra loss terms, e.g.
    the critic's value loss) add to the policy loss (`loss_terms`); their metrics are returned too.
    `guard` (the run's, so a streak of non-finite steps spans calls; default a fresh one) decides whether
    each optimizer step runs.

    Raises:
        NonFiniteUpdates: `optim.max_nonfinite_steps` optimizer steps in a row were not finite.
    """
    guard = guard if guard is not None else NonFiniteGuard(optim.max_nonfinite_steps)
    skipped_before = guard.skipped
    terms = loss_terms(alg, ref_model, terms)
    every_sample = any(term.trains_every_sample for term in terms)
    hidden_wanted = any(term.needs_hidden for term in terms)
    own_params = [(term.grad_norm_key, term.parameters()) for term in terms if term.grad_norm_key]
    # One sample per trajectory, or one per turn with the `step` context policy. A zero-advantage sample
    # adds exactly 0 to the policy loss, so it is not computed; it still counts in the loss's
    # denominator (its tokens for token_mean, its row otherwise), as in DAPO, TRL and verl: leaving it out
    # would scale each step's gradient by 1 / (its share of samples with signal).
    keep = [t.advantage != 0.0 or every_sample for t in trajs]
    samples = [(s, k, t.sample_index) for t, k in zip(trajs, keep) for s in t.training_samples()]
    if not any(keep):
        return {"actor/trained_fraction": 0.0}
    loss_fn = get_policy_loss(alg.policy_loss)
    own_old = old_log_probs_mode(alg, optim) == "update"
    rng = random.Random(seed)
    pad_id = policy.tokenizer.pad_token_id
    totals: dict[str, list[float]] = {}
    forward_tokens = 0  # padded tokens the update's forwards computed (packs count shared tokens once)
    policy.model.train()
    params = list(policy.model.parameters())
    stepped = False  # an optimizer step was taken in this update: later forwards are off-policy
    for _ in range(optim.ppo_epochs):
        order = samples[:]
        rng.shuffle(order)
        size = -(-len(order) // optim.mini_batches)
        for start in range(0, len(order), size):
            mini = order[start: start + size]
            tokens, rows = sum(sum(t.loss_mask) for t, _, _ in mini), len(mini)
            trained = [(t, key) for t, k, key in mini if k]
            if not trained:
                continue
            optimizer.zero_grad(set_to_none=True)
            losses: list[float] = []
            for micro, packed in forward_batches(policy, trained, optim):
                b = collate(micro, pad_id, policy.device)
                logprobs, hidden = _logprobs(policy, b, packed, hidden=hidden_wanted)
                forward_tokens += packed["input_ids"].numel() if packed else b["input_ids"].numel()
                old = logprobs.detach() if own_old else b["old_logprobs"]
                # the engine's log-probs against this forward's: numerics alone before the first optimizer
                # step of the update (the weights that sampled), staleness too after it (the run guard's)
                gap = "logprob_gap_stale" if stepped else "logprob_gap"
                totals.setdefault(gap, []).append(_logprob_gap(logprobs, b["old_logprobs"], b["loss_mask"]))
                advantages, corrected = b["advantages"], {}
                if alg.correction.type != "none":  # importance weights pi_old / pi_behaviour
                    advantages, corrected = correct_advantages(alg.correction, advantages, logprobs,
                                                               b["old_logprobs"], b["loss_mask"])
                loss, stats = loss_fn(logprobs, old, advantages, b["loss_mask"],
                                      clip_ratio_low=alg.clip_ratio_low, clip_ratio_high=alg.clip_ratio_high,
                                      agg=alg.loss_agg)
                stats.update(corrected)
                for term in terms:
                    extra, term_stats = term(policy, b, packed, logprobs, hidden)
                    loss = loss + extra
                    stats.update(term_stats)
                # Weight each micro-batch by its share of the mini-batch so accumulation gives the
                # same gradient as one big batch (by tokens for token_mean, by rows otherwise).
                share = (float(b["loss_mask"].sum()) / tokens) if alg.loss_agg == "token_mean" else len(micro) / rows
                (loss * share).backward()
                stats["loss"] = float(loss.detach())
                losses.append(stats["loss"])
                for k, v in stats.items():
                    totals.setdefault(k, []).append(float(v))
            norms = [float(torch.nn.utils.clip_grad_norm_(params, optim.grad_clip))]
            # a term's own parameters (the value head) are clipped on their own, as a separate model's would be
            norms += [float(torch.nn.utils.clip_grad_norm_(own, optim.grad_clip)) for _, own in own_params]
            if not guard.allows(losses, norms):
                optimizer.zero_grad(set_to_none=True)  # NaN gradients must not reach the weights or Adam's moments
                continue
            for key, norm in zip(("grad_norm", *(k for k, _ in own_params)), norms):
                totals.setdefault(key, []).append(norm)
            optimizer.step()
            scheduler.step()
            stepped = True
    policy.model.eval()
    metrics = {(k if k.startswith("critic/") else f"actor/{k}"): sum(v) / len(v) for k, v in totals.items()}
    metrics["update/skipped_nonfinite"] = float(guard.skipped - skipped_before)
    metrics["actor/trained_fraction"] = sum(keep) / len(trajs)
    metrics["actor/samples"] = sum(k for _, k, _ in samples)
    metrics["actor/forward_tokens"] = forward_tokens
    metrics["actor/lr"] = scheduler.get_last_lr()[0]
    return metrics


def _logprob_gap(logprobs: torch.Tensor, sampled: torch.Tensor, mask: torch.Tensor) -> float:
    """Mean |log p_train - log p_sampled| over the trained tokens of a micro-batch."""
    with torch.no_grad():
        return float(((logprobs.detach() - sampled).abs() * mask).sum() / mask.sum().clamp(min=1))


def forward_batches(policy, trained: list[tuple[Any, Any]], optim: OptimConfig) -> Iterator[tuple[list, dict | None]]:
    """The micro-batches of a mini-batch's (sample, prompt key) pairs: each with its packed forward inputs
    (samples of one prompt share a row, the prompt once: rl_factory/packing.py), or None for plain rows."""
    samples = [s for s, _ in trained]
    if not (optim.shared_prefix and policy.can_pack()):
        for micro in micro_batches(samples, optim.micro_batch_size, optim.micro_batch_tokens):
            yield micro, None
        return
    model = policy.model
    ratio = attention_cost_ratio(model.config, sum(p.numel() for p in model.parameters()))
    packs = build_packs(samples, [key for _, key in trained], ratio, optim.micro_batch_tokens)
    kind = MASK_KINDS[model.config._attn_implementation]
    for micro in micro_batches(packs, optim.micro_batch_size, optim.micro_batch_tokens,
                               width=lambda p: p.width, size=lambda p: len(p.samples)):
        yield ([s for p in micro for s in p.samples],
               pack_inputs(micro, policy.tokenizer.pad_token_id, policy.device, kind))


def _logprobs(policy, b: dict[str, torch.Tensor], packed: dict | None, model=None,
              hidden: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs [B, T] of the micro-batch's samples (and their last hidden states with `hidden`)."""
    if packed is not None:
        return policy.packed_logprobs(packed, b["input_ids"], model=model, hidden=hidden)
    if hidden:
        return policy.logprobs_and_hidden(b["input_ids"], b["attention_mask"])
    return policy.sequence_logprobs(b["input_ids"], b["attention_mask"], model=model), None
