"""What verl's actor trains, per trajectory: the trainer's side of the run guard's `tokens` check, read from the batch.

The engine's side of the check is the agent loop's receipts (the ids vLLM's server returned, per turn). Its
trainer's side must be what the update trains, not what the agent loop handed verl: between the two lie
verl's post-processing of each `AgentLoopOutput` (agent_loop_tq.py: the rows put into TransferQueue), the
trainer's passes that write the batch back (balancing and its padding rows, advantages, rollout correction
rewriting `response_mask`), and TransferQueue itself. So `TrainedBatch`, in front of verl's V1 trainer of the
configured mode (`trainer.v1.trainer_mode`: sync, colocate_async, separate_async all update through
`PPOTrainer._update_actor`), reads the step's batch from TransferQueue right before the actor worker group is
handed it, by the same keys, in the TaskRunner process: the fields the update's loss computes on, `input_ids`
(the sequence the forward runs; the loss takes the log-probs of its last len(`responses`) tokens,
verl/workers/utils/padding.py `no_padding_2_padding`) and `response_mask` (the policy loss's mask,
verl/workers/utils/losses.py `ppo_loss`). Per row it hashes every masked run of those trained ids
(`run_digests`: the digest the receipts use), groups the rows by trajectory (verl's keys are
`{uid}_{session}_{output}`; the agent loop records `{uid}_{session}` as the evidence's `session_key`), leaves out
verl's padding rows (`is_padding`), and hands the result to our metrics logger (run_dir.RunDirLogger, the same
process: verl's `Tracking` lives in the trainer), which puts it in place of the agent loop's trainer side before
the checks run (rl_factory/guard/lines.py).

What the actor worker does after its fetch (micro-batching, packing, the forward itself) and what vLLM does
before returning ids are not seen here (docs/guides/guard.md, "What the tokens check compares").

With verl's rejection sampling (`algorithm.rollout_correction.rollout_rs`), which zeroes tokens of
`response_mask` on purpose, the mask read is `loss_mask`, the copy of the agent loop's mask verl's
post-processing made and no trainer pass rewrites; the ids are still the batch's.
"""
from __future__ import annotations

import time
from typing import Any

from rl_factory.backends.verl.run_dir import LOGGER_NAME
from rl_factory.guard.evidence import run_digests

TIMING_KEY = "timing/guard_batch_s"  # the fetch and hashing, per step (metrics reference)


def session_key(key: str) -> str:
    """`{uid}_{session}` of verl's TransferQueue key `{uid}_{session}_{output}`."""
    return key.rsplit("_", 1)[0]


def mask_field(config: Any) -> str:
    """The field whose mask the update trains under, as far as the guard compares it (module docstring)."""
    correction = config.algorithm.get("rollout_correction", None) if hasattr(config, "algorithm") else None
    return "loss_mask" if correction and correction.get("rollout_rs", None) is not None else "response_mask"


def trained_rows(keys: list[str], data: Any, mask: str = "response_mask") -> dict[str, dict[str, Any]]:
    """Per trajectory (`session_key`): the digests of every masked run of the ids trained, in output order, and the
    number of tokens under the mask. `data`: the rows of `keys` with `input_ids`, `responses` and `mask`."""
    outputs: dict[str, list[tuple[int, list[str], int]]] = {}
    rows = zip(keys, data["input_ids"].unbind(0), data["responses"].unbind(0), data[mask].unbind(0))
    for key, sequence, response, row_mask in rows:
        trained = sequence[sequence.numel() - response.numel():]  # the tokens the loss takes log-probs of
        row_mask = row_mask[: trained.numel()]
        index = key.rsplit("_", 1)[1]
        outputs.setdefault(session_key(key), []).append(
            (int(index) if index.isdigit() else 0, run_digests(trained, row_mask), int(row_mask.sum())))
    return {k: {"trained": [d for _, digests, _ in sorted(v, key=lambda x: x[0]) for d in digests],
                "trained_tokens": sum(n for *_, n in v)} for k, v in outputs.items()}


def read_batch(batch: Any, mask: str = "response_mask") -> dict[str, dict[str, Any]]:
    """`trained_rows` of verl's KVBatchMeta `batch`, fetched from TransferQueue (its padding rows left out)."""
    import transfer_queue as tq

    keys = [k for k, tag in zip(batch.keys, batch.tags or [{}] * len(batch.keys)) if not (tag or {}).get("is_padding")]
    if not keys:
        return {}
    data = tq.kv_batch_get(keys=keys, partition_id=batch.partition_id, select_fields=["input_ids", "responses", mask])
    return trained_rows(keys, data, mask)


def batch_sink(trainer: Any) -> Any:
    """Our metrics logger inside the trainer's `Tracking`, if it wants the batch (the guard's tokens check is on)."""
    tracking = getattr(trainer, "logger", None)
    backend = getattr(tracking, "logger", {}).get(LOGGER_NAME) if tracking is not None else None
    return backend if backend is not None and backend.guard.wants_batch else None


class TrainedBatch:
    """In front of a verl V1 trainer: the update's batch, read and hashed per trajectory for the guard."""

    def _update_actor(self, batch, metrics):
        sink = batch_sink(self)
        if sink is not None:
            start = time.perf_counter()
            sink.guard.trained(int(self.global_steps), read_batch(batch, mask_field(self.config)))
            metrics[TIMING_KEY] = metrics.get(TIMING_KEY, 0.0) + time.perf_counter() - start
        return super()._update_actor(batch, metrics)


def wanted(cfg: Any) -> bool:
    """Whether the run's guard compares the actor's batch (on, with its tokens check on); `cfg`: verl's composed config."""
    from rl_factory.guard import guard_config

    guard = guard_config(cfg.rl_factory)
    return bool(guard.enabled) and guard.tokens.action != "off"


def use_trained_batch(trainer_mode: str) -> type:
    """Put TrainedBatch in front of the trainer registered as `trainer_mode` (idempotent); returns the class now there.
    Outermost, so it reads the batch as the update's own call (narrowed or not, fetch.py) will hand it on."""
    from rl_factory.backends.verl.trainer_front import put_in_front

    return put_in_front(trainer_mode, TrainedBatch)
