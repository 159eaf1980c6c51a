"""What the verl backend cannot train: the capability table (rl_factory/capabilities.py) read against our
config and, once composed, verl's.

`check(ours)` runs before composing (before a builtin model is built); `check(ours, cfg)` after, when the
keys of verl's composed config (`verl_facts`: V1 trainer, trainer mode, custom sampler, optimizer steps) are
known, raw verl overrides included. The old-log-probs limits are checked where the mode is resolved
(old_log_probs.py), which alone knows whether verl's bypass switch was given on the command line.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig

from rl_factory import capabilities
from rl_factory.algorithms.correction import check_correction
from rl_factory.backends.verl.asynchrony import staleness
from rl_factory.critic import check_critic_type

if TYPE_CHECKING:
    from rl_factory.config import RunConfig

# The custom sampler dynamic sampling installs (pipeline.RolloutReplayBuffer): ours, not a conflicting one.
OUR_SAMPLER_PATH = "pkg://rl_factory.backends.verl.pipeline"


def check(ours: RunConfig, cfg: DictConfig | None = None) -> None:
    """Refuse, with the table's one line, what verl cannot train in our config (and the composed `cfg`)."""
    check_critic_type(ours.algorithm.critic)
    check_correction(ours.algorithm.correction)
    facts = capabilities.facts(ours.algorithm, ours.rollout, reward=ours.reward, env=ours.env, data=ours.data,
                               trainer=ours.trainer)
    del facts["algorithm.old_log_probs"]  # old_log_probs.resolve checks it, knowing the command line
    capabilities.check("verl", {**facts, **(verl_facts(cfg) if cfg is not None else {})})


def verl_facts(cfg: DictConfig) -> dict[str, Any]:
    """The facts of verl's composed config that the table's limits read."""
    actor = cfg.actor_rollout_ref.actor
    corr = cfg.algorithm.get("rollout_correction") or {}
    correction = next((k for k in ("rollout_is", "rollout_rs") if corr.get(k) is not None), None)
    sampler = cfg.trainer.v1.sampler.custom_sampler.path
    mini_batches = -(-int(cfg.data.train_batch_size) // max(1, int(actor.ppo_mini_batch_size)))
    return {
        "trainer.use_v1": bool(cfg.trainer.use_v1),
        "trainer.v1.trainer_mode": cfg.trainer.v1.trainer_mode,
        "trainer.max_staleness": staleness(cfg),
        "trainer.v1.sampler.custom_sampler.path": None if sampler == OUR_SAMPLER_PATH else sampler,
        "algorithm.rollout_correction": correction,
        **({"algorithm.correction.type": "none"} if correction is None else {}),
        capabilities.OPTIMIZER_STEPS: int(actor.ppo_epochs) * mini_batches,
    }
