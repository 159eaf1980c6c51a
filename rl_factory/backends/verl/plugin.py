"""The `verl.plugins` entry point: our estimators and policy losses in verl's registries.

verl loads every `verl.plugins` entry point at `import verl` (verl/__init__.py), in every process:
the driver, the TaskRunner actor (where advantages are computed) and the FSDP actor workers (where
the policy loss runs). Registering there is the only way a name reaches all of them; a registration
made in the driver alone would not. verl swallows a plugin's exception at DEBUG level, so a failure
here is logged at ERROR with its traceback and kept in `REGISTRATION_ERROR`, and the launcher refuses
to start when our names are missing.

Registered estimators (verl's call: `fn(token_level_rewards, response_mask, index, config) ->
(advantages, returns)`): every estimator of `rl_factory.algorithms.advantages` whose required inputs
verl's call can fill (`VERL_INPUTS`: the response mask, and tournament scores, which the agent loop's
group stage puts where the rewards are), under its own name (`arena`, `dr_grpo`, `reinforce_pp`), or
as `rl_factory_<name>` where verl already owns the name (`grpo`, `rloo`; verl's are identical to ours to
1e-6, tests/algorithms/test_advantages.py). One that requires more (`gae`: the critic's values, which
verl passes only to its built-in GAE) is left to verl's own estimator of that name, or is not on verl.
Estimator options that verl's `algorithm` config cannot hold arrive as JSON in the environment
variable `RL_FACTORY_ADVANTAGE_OPTIONS` (the launcher puts it in Ray's runtime_env, so every node
sees it).

Registered policy losses (`actor_rollout_ref.actor.policy_loss.loss_mode`): each loss of
`rl_factory.algorithms.losses.POLICY_LOSS_TERMS` under its name (`ppo_clip`). The per-token terms
are ours; the aggregation is verl's `agg_loss` with its global-batch normalizer, so the loss is the
same whatever the micro-batch and data-parallel split.

It also adds the `rl_factory` backend to verl's `Tracking` (rl_factory/backends/verl/run_dir.py): the
TaskRunner process, which logs each step's metrics, imports verl too, so that is where our
metrics.jsonl and rollouts files get written.

Keep this module light: it runs while `verl/__init__` is still executing.
"""
from __future__ import annotations

import json
import logging
import os
import sys
import traceback
from typing import Any

log = logging.getLogger("rl_factory.verl")

OPTIONS_ENV = "RL_FACTORY_ADVANTAGE_OPTIONS"
# The mode old_log_probs.py resolved, in Ray's runtime_env; "update": the loss takes the update's own log-probs as the old ones
OLD_LOG_PROBS_ENV = "RL_FACTORY_OLD_LOG_PROBS"
# Outcome estimators verl does not get under their own name because verl has one of the same name.
VERL_OWNS = ("grpo", "rloo", "gae")
REGISTERED_ESTIMATORS: list[str] = []
REGISTERED_LOSSES: list[str] = []
REGISTRATION_ERROR: str | None = None

# The estimator inputs verl's call fills (beyond rewards and group ids); an estimator requiring others is not ours on verl.
VERL_INPUTS = ("scores", "response_mask")
# verl's loss_agg_mode names for ours (verl uses dashes).
AGG_NAMES = {"token_mean": "token-mean", "seq_mean_token_mean": "seq-mean-token-mean",
             "seq_mean_token_sum_norm": "seq-mean-token-sum-norm"}


def advantage_options() -> dict[str, Any]:
    raw = os.environ.get(OPTIONS_ENV, "")
    return json.loads(raw) if raw else {}


def _outcome_estimator(name: str):
    """verl's estimator signature around our registry entry `name`."""

    import inspect

    from rl_factory.algorithms.advantages import get_advantage

    takes_norm_by_std = "norm_by_std" in inspect.signature(get_advantage(name)).parameters

    def estimator(token_level_rewards, response_mask, index=None, config=None, **_: Any):
        import torch

        from rl_factory.algorithms.advantages import REQUIRED_INPUTS, AdvantageInputs, estimate

        mask = response_mask.to(token_level_rewards.dtype)
        # The outcome reward sits on the last response token (verl's rm_scores); summing is exact.
        rewards = (token_level_rewards * mask).sum(-1)
        group_ids = list(index) if index is not None else list(range(len(rewards)))
        # A row with no token to train is a trajectory a rollout filter dropped (rl_factory/backends/verl/
        # pipeline.py): like the embedded trainer, its group's statistics are those of the survivors.
        live = (mask.sum(-1) > 0).cpu()
        rows = live.nonzero()[:, 0].tolist()
        rewards_live = rewards.detach().double().cpu()[live]
        # a tournament estimator (arena): the agent loop put tournament scores where the rewards are
        scores = rewards_live if "scores" in REQUIRED_INPUTS[name] else None
        options = dict(advantage_options())
        if takes_norm_by_std and config is not None and "norm_by_std" not in options:  # grpo: verl's own key for it
            options["norm_by_std"] = bool(config.get("norm_adv_by_std_in_grpo", True))
        inputs = AdvantageInputs.build(rewards_live, [group_ids[i] for i in rows], scores=scores,
                                       response_mask=response_mask.detach().cpu()[live])
        adv = torch.zeros(len(rewards), dtype=token_level_rewards.dtype, device=token_level_rewards.device)
        with torch.no_grad():
            adv[live.to(adv.device)] = estimate(name, inputs, **options).to(adv.device, adv.dtype)
        adv = adv.unsqueeze(-1) * mask  # broadcast over the trajectory's response tokens
        return adv, adv

    estimator.__name__ = f"rl_factory_{name}"
    estimator.__qualname__ = estimator.__name__
    return estimator


def _policy_loss(name: str):
    """verl's policy-loss signature around our per-token loss `name`, aggregated by verl's agg_loss."""

    def loss(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean", config=None,
             rollout_is_weights=None):
        from verl.trainer.ppo.core_algos import agg_loss

        from rl_factory.algorithms.losses import POLICY_LOSS_TERMS, masked_mean
        from rl_factory.backends.verl.sampling_logprobs import ABSENT

        low = config.clip_ratio_low if config.clip_ratio_low is not None else config.clip_ratio
        high = config.clip_ratio_high if config.clip_ratio_high is not None else config.clip_ratio
        extra = {}
        if os.environ.get(OLD_LOG_PROBS_ENV) == "update":
            # algorithm.old_log_probs=update (old_log_probs.py): verl skipped its forward pass and put vLLM's
            # sampling log-probs here; with one optimizer step per batch the policy that sampled is the one
            # being updated, so its log-probs are this forward's own. vLLM's distance from them is the health
            # check verl's skipped pass would have logged (it grows if vLLM samples stale weights). Rollouts that
            # did not ask vLLM for them (sampling_logprobs.py) hold ABSENT, which no log-prob equals.
            sampled = response_mask.bool() & (old_log_prob < ABSENT)
            if sampled.any():
                extra["actor/rollout_probs_diff_mean"] = masked_mean(
                    (log_prob.detach().exp() - old_log_prob.exp()).abs(), sampled.to(log_prob.dtype)).item()
            old_log_prob = log_prob.detach()
        loss_mat, metrics = POLICY_LOSS_TERMS[name](log_prob, old_log_prob, advantages, response_mask, low, high)
        if rollout_is_weights is not None:
            loss_mat = loss_mat * rollout_is_weights
        value = agg_loss(loss_mat=loss_mat, loss_mask=response_mask, loss_agg_mode=loss_agg_mode,
                         **config.global_batch_info)
        return value, {"actor/pg_clipfrac": metrics["clipfrac"], "actor/ppo_kl": metrics["approx_kl"],
                       "actor/ratio_mean": metrics["ratio_mean"], **extra}

    loss.__name__ = f"rl_factory_{name}"
    return loss


def verl_fills(name: str) -> bool:
    """Whether verl's estimator call can fill every input our estimator `name` requires."""
    from rl_factory.algorithms.advantages import required_inputs

    return set(required_inputs(name)) <= set(VERL_INPUTS)


def registered_name(name: str) -> str:
    """Where our estimator `name` lives in verl's registry."""
    return f"rl_factory_{name}" if name in VERL_OWNS else name


def register() -> None:
    """Add our estimators and losses to verl's registries (runs once per process, at `import verl`)."""
    from verl.trainer.ppo import core_algos

    from rl_factory.algorithms.advantages import ADVANTAGES
    from rl_factory.algorithms.losses import POLICY_LOSS_TERMS

    for name in sorted(ADVANTAGES):
        if not verl_fills(name):
            continue
        key = registered_name(name)
        _check_free(core_algos.ADV_ESTIMATOR_REGISTRY, key, "an advantage estimator")
        core_algos.register_adv_est(key)(_outcome_estimator(name))
        REGISTERED_ESTIMATORS.append(key)
    for name in sorted(POLICY_LOSS_TERMS):
        _check_free(core_algos.POLICY_LOSS_REGISTRY, name, "a policy loss")
        core_algos.register_policy_loss(name)(_policy_loss(name))
        REGISTERED_LOSSES.append(name)
    from verl.utils.tracking import Tracking

    from rl_factory.backends.verl.run_dir import install

    install(Tracking)


def _check_free(registry: dict[str, Any], name: str, kind: str) -> None:
    """A name verl (or another plugin) already uses must not silently become ours, nor stay theirs."""
    existing = registry.get(name)
    if existing is not None:
        raise RuntimeError(f"verl already has {kind} named {name!r} "
                           f"({existing.__module__}.{existing.__qualname__}); rl_factory's cannot be registered")


try:
    register()
except Exception:  # verl would swallow it at DEBUG level: say it where it will be seen
    REGISTRATION_ERROR = traceback.format_exc()
    log.error("rl_factory could not register its estimators and losses with verl:\n%s", REGISTRATION_ERROR)
    print(f"[rl_factory] ERROR: registering with verl failed:\n{REGISTRATION_ERROR}", file=sys.stderr)
