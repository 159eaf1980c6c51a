"""verl's V1 replay buffers, polling TransferQueue every 50 ms instead of every 2 s.

verl's V1 trainer waits for a step's rollouts in `ReplayBuffer.sample`, which checks TransferQueue and
then sleeps `poll_interval` (2.0 s, not a config key) until the batch is complete. The `gen` phase
(our `timing/rollout_s`) is therefore a whole number of polls: on one H200 it was 4.07-4.09 s for the
0.44B and the 4B shapes alike, and for verl's own tool agent loop, while vLLM alone generated the
same tokens in 1.45 s. Each check is one small TransferQueue listing, so 50 ms costs nothing and
leaves at most 50 ms of a finished rollout waiting.

We install it through verl's own hook (`trainer.v1.sampler.custom_sampler`) for the sync trainer
(verl's default and ours), and `PollingReplayBufferAsync` (verl's `ReplayBufferAsync` with the same poll) for
its async trainers (`trainer.max_staleness` > 0), unless the command line names another sampler or turns on
verl's own DAPO filter (`algorithm.filter_groups.enable`); those keep verl's class. verl hands a custom sampler fewer
arguments than its built-in one, so the ones it would have passed travel in
`sampler_kwargs.rl_factory.builtin`. The interval is `sampler_kwargs.rl_factory.poll_interval_s`.
"""
from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, OmegaConf

from rl_factory.backends.verl.asynchrony import ASYNC_MODES
from rl_factory.config import plain

try:  # verl's V1 trainer (TransferQueue); the config helpers below need neither
    from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer, ReplayBufferAsync
except ImportError:  # pragma: no cover - verl without its V1 dependencies
    ReplayBuffer = ReplayBufferAsync = object

POLL_INTERVAL_S = 0.05
SAMPLER_PATH = "pkg://rl_factory.backends.verl.sampler"
SAMPLER_NAME = "PollingReplayBuffer"
ASYNC_SAMPLER_NAME = "PollingReplayBufferAsync"


def _with_ours(sampler_kwargs: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    """The constructor's arguments with our poll interval and, unless the caller passes its own, the ones verl
    gives its built-in sampler (module docstring)."""
    ours = plain(sampler_kwargs.get("rl_factory") if sampler_kwargs else None) or {}
    kwargs.setdefault("poll_interval", float(ours.get("poll_interval_s", POLL_INTERVAL_S)))
    for key, value in (ours.get("builtin") or {}).items():
        kwargs.setdefault(key, value)
    return kwargs


class PollingReplayBuffer(ReplayBuffer):
    """verl's sync `ReplayBuffer`, polling every 50 ms."""

    def __init__(self, *args: Any, sampler_kwargs: Any, **kwargs: Any):
        super().__init__(*args, sampler_kwargs=sampler_kwargs, **_with_ours(sampler_kwargs, kwargs))


class PollingReplayBufferAsync(ReplayBufferAsync):
    """verl's `ReplayBufferAsync` (its async trainers' staleness-bounded sampler), polling every 50 ms: its own
    2-s poll made every step that waited for a batch a whole number of polls (H200, k=1: rollouts of 2.05 s
    for the tiny model, whose slowest trajectory took 1.3-1.7 s, and 8.06 s at 0.6B)."""

    def __init__(self, *args: Any, sampler_kwargs: Any, **kwargs: Any):
        super().__init__(*args, sampler_kwargs=sampler_kwargs, **_with_ours(sampler_kwargs, kwargs))


def sampler_values(cfg: DictConfig, given: set[str]) -> dict[str, Any]:
    """verl key -> value installing `PollingReplayBuffer` (sync trainer) or `PollingReplayBufferAsync` (verl's
    async trainers), or {} where verl's own sampler must stay."""
    sampler = cfg.trainer.v1.sampler
    filter_groups = cfg.algorithm.get("filter_groups") or {}
    mode = cfg.trainer.v1.trainer_mode
    if (mode not in ("sync", *ASYNC_MODES) or sampler.custom_sampler.get("path")
            or any(k.startswith("trainer.v1.sampler.custom_sampler") for k in given) or filter_groups.get("enable")):
        return {}
    refill_failed = bool(sampler.get("sync_refill_failed_groups", False))
    batch = int(cfg.data.train_batch_size)
    # as verl's PPOTrainer._build_replay_buffer for its built-in sampler without group filtering (the sync
    # ReplayBuffer also gets the batch sizes)
    builtin: dict[str, Any] = {"filter_groups_metric": None, "sync_refill_failed_groups": refill_failed}
    if mode == "sync":
        builtin.update({"train_batch_size": batch, "max_inflight_gen_batches": 1,
                        "gen_batch_size": 1 if refill_failed else int(cfg.data.get("gen_batch_size") or batch)})
    ours = OmegaConf.merge({"poll_interval_s": POLL_INTERVAL_S, "builtin": builtin},  # the command line's win
                           sampler.get("sampler_kwargs", {}).get("rl_factory") or {})
    return {"trainer.v1.sampler.custom_sampler.path": SAMPLER_PATH,
            "trainer.v1.sampler.custom_sampler.name": SAMPLER_NAME if mode == "sync" else ASYNC_SAMPLER_NAME,
            "trainer.v1.sampler.sampler_kwargs.rl_factory": OmegaConf.to_container(ours)}
