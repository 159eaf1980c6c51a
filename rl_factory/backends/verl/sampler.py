"""verl's sync V1 replay buffer, polling TransferQueue every 50 ms instead of every 2 s.

verl's V1 trainer waits for a step's rollouts in `ReplayBuffer.sample`, which checks TransferQueue and
then sleeps `poll_interval` (2.0 s, not a config key) until the batch is complete. The `gen` phase
(our `timing/rollout_s`) is therefore a whole number of polls: on one H200 it was 4.07-4.09 s for the
0.44B and the 4B shapes alike, and for verl's own tool agent loop, while vLLM alone generated the
same tokens in 1.45 s. Each check is one small TransferQueue listing, so 50 ms costs nothing and
leaves at most 50 ms of a finished rollout waiting.

We install it through verl's own hook (`trainer.v1.sampler.custom_sampler`) for the sync trainer
(verl's default and ours) unless the command line names another sampler or turns on verl's own DAPO
filter (`algorithm.filter_groups.enable`); those keep verl's class. verl hands a custom sampler fewer
arguments than its built-in one, so the ones it would have passed travel in
`sampler_kwargs.rl_factory.builtin`. The interval is `sampler_kwargs.rl_factory.poll_interval_s`.
"""
from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, OmegaConf

from rl_factory.config import plain

try:  # verl's V1 trainer (TransferQueue); the config helpers below need neither
    from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer
except ImportError:  # pragma: no cover - verl without its V1 dependencies
    ReplayBuffer = object

POLL_INTERVAL_S = 0.05
SAMPLER_PATH = "pkg://rl_factory.backends.verl.sampler"
SAMPLER_NAME = "PollingReplayBuffer"


class PollingReplayBuffer(ReplayBuffer):
    """verl's sync `ReplayBuffer` with our poll interval and, unless the caller passes its own, the
    arguments verl gives its built-in sampler (module docstring)."""

    def __init__(self, *args: Any, sampler_kwargs: Any, **kwargs: Any):
        ours = plain(sampler_kwargs.get("rl_factory") if sampler_kwargs else None) or {}
        kwargs.setdefault("poll_interval", float(ours.get("poll_interval_s", POLL_INTERVAL_S)))
        for key, value in (ours.get("builtin") or {}).items():
            kwargs.setdefault(key, value)
        super().__init__(*args, sampler_kwargs=sampler_kwargs, **kwargs)


def sampler_values(cfg: DictConfig, given: set[str]) -> dict[str, Any]:
    """verl key -> value installing `PollingReplayBuffer`, or {} where verl's own sampler must stay."""
    sampler = cfg.trainer.v1.sampler
    filter_groups = cfg.algorithm.get("filter_groups") or {}
    if (cfg.trainer.v1.trainer_mode != "sync" or sampler.custom_sampler.get("path")
            or any(k.startswith("trainer.v1.sampler.custom_sampler") for k in given) or filter_groups.get("enable")):
        return {}
    refill_failed = bool(sampler.get("sync_refill_failed_groups", False))
    batch = int(cfg.data.train_batch_size)
    # as verl's PPOTrainer._build_replay_buffer for its sync ReplayBuffer without group filtering
    builtin = {"filter_groups_metric": None, "sync_refill_failed_groups": refill_failed, "train_batch_size": batch,
               "gen_batch_size": 1 if refill_failed else int(cfg.data.get("gen_batch_size") or batch),
               "max_inflight_gen_batches": 1}
    ours = OmegaConf.merge({"poll_interval_s": POLL_INTERVAL_S, "builtin": builtin},  # the command line's win
                           sampler.get("sampler_kwargs", {}).get("rl_factory") or {})
    return {"trainer.v1.sampler.custom_sampler.path": SAMPLER_PATH,
            "trainer.v1.sampler.custom_sampler.name": SAMPLER_NAME,
            "trainer.v1.sampler.sampler_kwargs.rl_factory": OmegaConf.to_container(ours)}
