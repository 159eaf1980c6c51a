"""What a verl worker call spends on the step's data before any compute, on CPU: every field (verl) or the
fields the workers read (ours, rl_factory/backends/verl/fetch.py).

    .venv/bin/python benchmarks/worker_fetch.py --prompts 16 --n 8 --repeats 10

One rollout step of each loop runs for real (benchmarks/verl_loop_overhead.py: Ray, TransferQueue, verl's
AgentLoopWorkerTQ and RewardLoopWorker, a scripted model), then, while TransferQueue holds its trajectories,
a worker-side call is timed the way verl's actor worker receives the batch: verl's `tqbridge` turns the
trainer's KVBatchMeta into a TensorDict (the fetch), and verl's `prepare_micro_batches` splits it by token
budget (what `infer_batch` and `train_mini_batch` do first). Each repeat times both, alternating which goes
first. Not measured here: the copies of each micro-batch to the GPU, which also shrink with the fields.

Prints one JSON line: per loop, the field counts and the median (and all) milliseconds of the fetch and the
split, for every field and for ours; and `guard_read_ms`: the run guard's read of the same batch in the trainer
(rl_factory/backends/verl/trained.py `read_batch`: input_ids, responses and response_mask fetched, every masked run
hashed), which the update's call pays once a step.
"""
from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.record import emit  # noqa: E402


def time_calls(keys: list[str], repeats: int) -> dict:
    from transfer_queue.metadata import KVBatchMeta
    from verl.utils import tensordict_utils as tu
    from verl.utils.transferqueue_utils import tqbridge
    from verl.workers.engine.utils import prepare_micro_batches

    from rl_factory.backends.verl.fetch import narrowed

    seen: dict[str, list] = {"fetch": [], "split": [], "fields": []}

    @tqbridge()
    def worker(data):  # the worker's side: data arrives fetched; then verl splits it into micro-batches
        seen["fetch"].append(time.perf_counter() - seen.pop("t0"))
        seen["fields"] = sorted(data.keys())
        t0 = time.perf_counter()
        tu.assign_non_tensor(data, use_dynamic_bsz=True, max_token_len_per_gpu=32768)
        prepare_micro_batches(data)
        seen["split"].append(time.perf_counter() - t0)

    from rl_factory.backends.verl.trained import read_batch

    out: dict[str, dict] = {}
    reads = []
    for k in range(repeats):
        t0 = time.perf_counter()
        read_batch(KVBatchMeta(keys=list(keys), tags=[{}] * len(keys), partition_id="train"))
        reads.append(round(1000 * (time.perf_counter() - t0), 1))
        for which in (("all", "needed") if k % 2 == 0 else ("needed", "all")):
            meta = KVBatchMeta(keys=list(keys), tags=[{}] * len(keys), partition_id="train")
            seen["t0"] = time.perf_counter()
            if which == "needed":
                with narrowed(meta):
                    worker(meta)
            else:
                worker(meta)
            side = out.setdefault(which, {"fetch_ms": [], "split_ms": []})
            side["fetch_ms"].append(round(1000 * seen["fetch"][-1], 1))
            side["split_ms"].append(round(1000 * seen["split"][-1], 1))
            side["fields"] = seen["fields"]
    for side in out.values():
        side["fetch_ms_median"] = statistics.median(side["fetch_ms"])
        side["split_ms_median"] = statistics.median(side["split_ms"])
        side["num_fields"] = len(side["fields"])
    out["guard_read_ms"] = {"median": statistics.median(reads), "all": reads}
    out["saved_ms_median"] = round(out["all"]["fetch_ms_median"] + out["all"]["split_ms_median"]
                                   - out["needed"]["fetch_ms_median"] - out["needed"]["split_ms_median"], 1)
    return out


def main() -> None:
    from benchmarks import verl_loop_overhead

    ap = verl_loop_overhead.parser(__doc__, 10, "timed calls of each kind")
    ap.add_argument("--loops", nargs="+", default=["rl_factory", "verl_tool_agent"],
                    choices=["rl_factory", "verl_tool_agent"])
    args = ap.parse_args()
    args.repeats, calls = 1, args.repeats  # one rollout step (after the warm-up) to time the calls on
    steps = verl_loop_overhead.each_loop("worker_fetch", args, args.loops, lambda keys, cfg: time_calls(keys, calls))
    out = {"bench": "worker_fetch", "prompts": args.prompts, "n": args.n, "repeats": calls, "cpu_count": os.cpu_count()}
    for loop, step in steps.items():
        out[loop] = {"trajectories": step["trajectories"], **step["then"]}
    emit("worker_fetch", out)


if __name__ == "__main__":
    main()
