"""Where verl's old-log-prob call spends its time besides the model's forward, on CPU.

    .venv/bin/python benchmarks/old_log_prob_call.py --prompts 16 --n 8 --repeats 10

One rollout step of our loop runs for real (benchmarks/verl_loop_overhead.py: Ray, TransferQueue, verl's
AgentLoopWorkerTQ and RewardLoopWorker, a scripted model). While TransferQueue holds its trajectories,
verl's own `_compute_old_log_prob` (trainer_base.py, `algorithm.old_log_probs=recompute`) runs on copies of
them three ways, alternating the order: through verl's trainer (`all`: every field), with fetch.UNREAD alone
(`common_unread`), and through our trainer (`needed`: also the pass's FORWARD_UNREAD, and the trainer's put
of the old log-probs alone, fetch.old_log_prob_pass). Its worker
group receives the batch the way verl's actor worker does (verl's `tqbridge`: metadata, fetch, and the
output's put back) and splits it with verl's `prepare_micro_batches`; the forward is replaced by the
output it would return (full-sequence log-probs and entropy, float32), so what is timed is everything
in the phase but the forward and the copies to and from the GPU.

Prints one JSON line: per way, the median milliseconds of the whole call and of each part (the labels
below), over the repeats.
"""
from __future__ import annotations

import os
import statistics
import sys
import time
from collections import defaultdict
from contextlib import ExitStack, contextmanager
from pathlib import Path
from unittest import mock

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.record import emit  # noqa: E402


@contextmanager
def timed(spent: dict, targets: dict):
    """Each `(label, owner, attribute)` in `targets` adds its calls' seconds to spent[label] while inside."""
    def wrap(label, fn):
        def inner(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[label] += time.perf_counter() - t0
        return inner

    with ExitStack() as stack:
        for label, owner, name in targets:
            stack.enter_context(mock.patch.object(owner, name, wrap(label, getattr(owner, name))))
        yield


def workers(spent: dict):
    """An actor worker group whose compute_log_prob is verl's tqbridge around the split and a forward's output."""
    import torch
    from tensordict import TensorDict
    from verl.utils import tensordict_utils as tu
    from verl.utils.transferqueue_utils import tqbridge
    from verl.workers.engine.utils import prepare_micro_batches

    class Workers:
        @staticmethod
        @tqbridge()
        def compute_log_prob(data):
            spent["fields"] = sorted(data.keys())
            t0 = time.perf_counter()
            tu.assign_non_tensor(data, use_dynamic_bsz=True, max_token_len_per_gpu=32768)
            prepare_micro_batches(data)
            spent["worker_split"] += time.perf_counter() - t0
            lengths = data["input_ids"].offsets().diff().tolist()
            rows = [torch.full((n,), -0.5) for n in lengths]
            return TensorDict({"log_probs": torch.nested.as_nested_tensor(rows, layout=torch.jagged),
                               "entropy": torch.nested.as_nested_tensor(rows, layout=torch.jagged)},
                              batch_size=[len(lengths)])

    return Workers()


def time_calls(cfg, keys: list[str], repeats: int) -> dict:
    import transfer_queue as tq
    from omegaconf import OmegaConf
    from transfer_queue.metadata import KVBatchMeta
    from verl.trainer.ppo.v1 import trainer_base
    from verl.utils import transferqueue_utils as tqu
    from verl.utils.debug import metrics as debug_metrics
    from verl.workers.utils import padding

    from rl_factory.backends.verl import fetch

    OmegaConf.update(cfg, "algorithm.rollout_correction.bypass_mode", False)  # the pass runs (recompute)
    verls = trainer_base.get_trainer_cls("sync")

    class CommonOnly(verls):  # fetch.UNREAD alone: the first narrowing of the fetch, measured on the H200
        def _compute_old_log_prob(self, batch, metrics):
            with fetch.narrowed(batch):
                return super()._compute_old_log_prob(batch, metrics)

    classes = {"all": verls, "common_unread": CommonOnly, "needed": fetch.use_narrow_fetch("sync")}
    targets = [
        ("worker_meta", tqu, "kv_batch_meta2batch_meta"),  # KVBatchMeta -> BatchMeta (also our narrowing's lookup)
        ("worker_fetch", tqu, "_meta_to_realdata"),
        ("worker_put", tqu, "_update_meta_with_output"),
        ("worker_keys", tqu, "batch_meta2kv_batch_meta"),
        ("trainer_get", tq, "kv_batch_get"),
        ("trainer_put", tq, "kv_batch_put"),
        # verl's pass calls them by trainer_base's names, ours (fetch.old_log_prob_pass) from their modules
        ("trainer_slice", trainer_base, "response_from_nested"),
        ("trainer_slice", padding, "response_from_nested"),
        ("trainer_debug_metrics", trainer_base, "calculate_debug_metrics"),
        ("trainer_debug_metrics", debug_metrics, "calculate_debug_metrics"),
    ]
    rollout = tq.kv_batch_get(keys=keys, partition_id="train")
    out: dict[str, dict] = {}
    for k in range(repeats):
        for which in (list(classes) if k % 2 == 0 else list(classes)[::-1]):
            # each call on a fresh copy of the rollout's samples: none holds an earlier call's output
            copy = [f"{key}/{k}{which}" for key in keys]
            tq.kv_batch_put(keys=copy, partition_id="train", fields=rollout)
            trainer = classes[which].__new__(classes[which])  # the method reads only config and the worker group
            spent: dict = defaultdict(float)
            trainer.config, trainer.actor_rollout_wg = cfg, workers(spent)
            batch = KVBatchMeta(keys=copy, tags=[{}] * len(keys), partition_id="train")
            with timed(spent, targets):
                t0 = time.perf_counter()
                trainer._compute_old_log_prob(batch, {})
                spent["call"] = time.perf_counter() - t0
            fields = spent.pop("fields")
            spent["other"] = 2 * spent["call"] - sum(spent.values())
            side = out.setdefault(which, defaultdict(list))
            side["worker_fields"] = fields
            for label, s in spent.items():
                side[label].append(round(1000 * s, 2))
    return {which: {f"{label}_ms": statistics.median(v) for label, v in side.items() if label != "worker_fields"}
            | {"call_ms_all": side["call"], "worker_fields": side["worker_fields"]} for which, side in out.items()}


def main() -> None:
    from benchmarks import verl_loop_overhead

    args = verl_loop_overhead.parser(__doc__, 10, "timed calls of each way").parse_args()
    args.repeats, calls = 1, args.repeats  # one rollout step (after the warm-up) to time the calls on
    step = verl_loop_overhead.each_loop("old_log_prob_call", args, ["rl_factory"],
                                        lambda keys, cfg: time_calls(cfg, keys, calls))["rl_factory"]
    emit("old_log_prob_call", {"bench": "old_log_prob_call", "prompts": args.prompts, "n": args.n, "repeats": calls,
                      "trajectories": step["trajectories"], "cpu_count": os.cpu_count(), **step["then"]})


if __name__ == "__main__":
    main()
