"""What verl's worker calls fetch from TransferQueue: the fields the workers read, not every field.

verl's V1 trainer hands its worker groups a `KVBatchMeta` without `fields` (trainer_base.py), and each
worker then fetches every field of every sample (verl's `tqbridge`: `select_fields` only when `fields` is
set), splits all of them into micro-batches and moves them to the device. A step of the calculator job
holds 26-28 fields, most of them what the dataset and the rollout left for the reward and the logs: raw
prompts, reward_model, tools_kwargs, the agent loop's extra fields (our trajectory records among them),
rm_scores... None of the actor, critic or reference workers reads them (verl 0.9.1: grep of
verl/workers for each name). Measured on CPU (`benchmarks/worker_fetch.py`, 2-core VM, 2026-12-03; 128
trajectories of our loop from verl's V1 rollout, the worker's side of one call, medians of 10): fetching all
26 fields 85.5 ms, the 9 the workers read 49.3 ms; splitting them into micro-batches 32.8 against 16.4 ms.
The old-log-prob, reference, value and update calls each pay it once a step.

So our trainer, verl's trainer of the configured mode (`trainer.v1.trainer_mode`) with `NarrowFetch` in
front, sets `fields` for those calls to every field but UNREAD (which also drops the old-log-prob pass's
raw full-sequence output from the update's fetch), less, for the log-prob passes, what only the losses read
(FORWARD_UNREAD), and puts it back after. On the H200 (2026-12-03, 0.6B shape, `old_log_probs=recompute`,
two calls back to back, UNREAD alone) the old-log-prob phase took 0.51 s a step against 0.73 s fetching every
field, and the update 1.19 against 1.55 s. On CPU, the whole old-log-prob call but the forward
(`benchmarks/old_log_prob_call.py`, medians of 10): 235 ms with every field, 160 with UNREAD, 153 with
FORWARD_UNREAD too. Its old-log-prob pass also puts back the old log-probs alone (`old_log_prob_pass`):
H200, 2026-12-04, same job, 0.470 s before, 0.453 and 0.435 s after (0.51 and 0.52 of the forward ceiling).
It takes the mode's place in verl's trainer registry inside our TaskRunner only (runner.py): the mode's
name stays, because verl's trainer branches on it (`self.trainer_mode != "sync"`, the replay buffer's class).
`worker_fetch: all` in configs/verl.yaml keeps verl's own fetch.
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from rl_factory.config import ConfigError

# Fields no worker reads: what the dataset, the agent loop and the reward put for the trainer's reward, metrics
# and dumps, and a pass's raw output the trainer has re-put in the form the update reads. Anything not named
# here is fetched (a field some worker needs is never left out by default).
UNREAD = frozenset({
    # dataset columns (verl's RLHFDataset rows, ours from rl_factory/backends/verl/data.py)
    "data_source", "prompt", "raw_prompt", "reward_model", "extra_info", "index", "tools_kwargs",
    "interaction_kwargs", "uid", "rl_factory_sample", "rl_factory_split", "dummy_tensor",
    # the agent loop's bookkeeping (verl's AgentLoopOutput post-processing)
    "extra_fields", "metrics", "num_turns", "session_id", "mm_processor_kwargs", "mm_processor_output",
    # the reward and what the trainer derives from it for the advantage
    "rm_scores", "token_level_scores", "token_level_rewards",
    # the old-log-prob and reference passes' full-sequence log-probs: the trainer puts them back sliced to the
    # responses as old_log_probs / ref_log_prob, which the update reads
    "log_probs",
    # the old-log-prob pass's entropy, which the trainer puts back sliced for its `actor/entropy` metric: the
    # losses take the entropy of their own forward (verl's losses.py: model_output["entropy"])
    "entropy",
})
# ...and what the log-prob passes (old and reference) do not read either: the actor's forward runs on the packed
# sequences (input_ids, position_ids; loss_mask counts the tokens); the responses' own tensors and vLLM's
# log-probs are read by the losses and the trainer (verl 0.9.1; tests/backends/test_verl_fetch.py runs verl's
# actor worker on both fetches and compares). The critic's value pass keeps them: nothing here runs it.
FORWARD_UNREAD = frozenset({"prompts", "responses", "rollout_log_probs"})
MODES = ("needed", "all")


def mode(cfg: Any) -> str:
    """`worker_fetch` of the composed verl config; anything but MODES is refused with one line."""
    value = cfg.get("worker_fetch", "needed")
    if value not in MODES:
        raise ConfigError(f"worker_fetch={value!r}: expected one of {', '.join(MODES)} (configs/verl.yaml)")
    return value


def worker_fields(fields: Iterable[str], unread: frozenset[str] = frozenset()) -> list[str]:
    """The fields a worker call fetches, of a batch holding `fields` (their order kept); `unread`: the call's own."""
    return [f for f in fields if f not in UNREAD and f not in unread]


@contextmanager
def narrowed(batch: Any, unread: frozenset[str] = frozenset()) -> Iterator[Any]:
    """`batch` (verl's KVBatchMeta) with `fields` set to what the workers read, for one worker call."""
    from verl.utils.transferqueue_utils import kv_batch_meta2batch_meta

    before = batch.fields
    # the trainer's meta names no fields (= all): the controller knows them, one metadata call
    every = before if before is not None else kv_batch_meta2batch_meta(batch).field_names
    batch.fields = worker_fields(every, unread)
    try:
        yield batch
    finally:
        batch.fields = before


# verl's V1 trainer methods that hand the step's batch to a worker group (trainer_base.py), each with the fields
# its workers leave unread beyond UNREAD
WORKER_CALLS = {
    "_compute_old_log_prob": FORWARD_UNREAD,
    "_compute_ref_log_prob": FORWARD_UNREAD,
    "_compute_values": frozenset(),
    "_update_critic": frozenset(),
    "_update_actor": frozenset(),
}


class NarrowFetch:
    """In front of a verl V1 trainer: each of WORKER_CALLS runs with the batch narrowed to what workers read."""


def _narrowing(name: str, unread: frozenset[str]):
    def method(self, batch, metrics):
        with narrowed(batch, unread):
            return getattr(super(NarrowFetch, self), name)(batch, metrics)

    method.__name__ = method.__qualname__ = name
    return method


for _name, _unread in WORKER_CALLS.items():
    setattr(NarrowFetch, _name, _narrowing(_name, _unread))


def old_log_prob_pass(self, batch, metrics):
    """verl's old-log-prob pass (PPOTrainer._compute_old_log_prob, recompute mode) on the narrowed fetch, putting
    back `old_log_probs` alone.

    verl's puts the pass's entropy back too, sliced to the responses, but nothing fetches it: the losses take
    the entropy of their own forward, and the trainer's `actor/entropy` metric is computed here from the copy
    it already holds (H200, 2026-12-04: the trainer's put of the two fields took ~40 ms of the 0.47 s phase,
    py-spy). The rest is verl's code as it is: the same fetch, slices, metric and debug metrics.
    """
    import transfer_queue as tq
    from verl.protocol import DataProto
    from verl.trainer.ppo.core_algos import agg_loss
    from verl.utils.debug.metrics import calculate_debug_metrics
    from verl.workers.utils.padding import response_from_nested

    correction = self.config.algorithm.get("rollout_correction", None)
    if correction and correction.get("bypass_mode", False):  # no pass: verl copies vLLM's log-probs
        return super(NarrowFetch, self)._compute_old_log_prob(batch, metrics)
    rollout, actor = self.config.actor_rollout_ref.rollout, self.config.actor_rollout_ref.actor
    batch.extra_info.update({"calculate_entropy": True, "compute_loss": False, "temperature": rollout.temperature})
    with narrowed(batch, FORWARD_UNREAD):
        output = self.actor_rollout_wg.compute_log_prob(batch)
    assert len(output) == len(batch)
    fields = ["entropy", "log_probs", "response_mask"] + (["responses", "rollout_log_probs"]
                                                          if rollout.calculate_log_probs else [])
    data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=fields)
    data["old_log_probs"] = response_from_nested(data.pop("log_probs"), data["response_mask"])
    data["entropy"] = response_from_nested(data.pop("entropy"), data["response_mask"])
    batch = tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id, fields=data.select("old_log_probs"))
    data = DataProto(batch=data.to_padded_tensor())
    metrics["actor/entropy"] = agg_loss(loss_mat=data.batch["entropy"], loss_mask=data.batch["response_mask"],
                                        loss_agg_mode=actor.loss_agg_mode,
                                        loss_scale_factor=actor.loss_scale_factor).detach().item()
    if rollout.calculate_log_probs:
        metrics.update(calculate_debug_metrics(data))
    return batch


def use_narrow_fetch(trainer_mode: str) -> type:
    """Put NarrowFetch in front of the trainer registered as `trainer_mode` (idempotent); returns the class now there.

    A trainer that keeps verl's own old-log-prob pass gets `old_log_prob_pass` in its place; one that overrides it
    (verl's separate_async swaps weights around it) keeps its own, narrowed.
    """
    from verl.trainer.ppo.v1 import trainer_base

    from rl_factory.backends.verl.trainer_front import put_in_front

    base = trainer_base.get_trainer_cls(trainer_mode)
    own = base._compute_old_log_prob is trainer_base.PPOTrainer._compute_old_log_prob
    return put_in_front(trainer_mode, NarrowFetch, attrs={"_compute_old_log_prob": old_log_prob_pass} if own else None)

