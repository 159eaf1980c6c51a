"""vLLM's engine settings for a rollout replica: what tuning.py plans for verl's vLLM server beside the memory.

Each one a key under `actor_rollout_ref.rollout` that verl hands to vLLM's engine, set with the reason in one line
(`Plan.set`); a key given on the command line wins (config.py). The memory (vLLM's share, its KV cache, whether
it sleeps) is tuning.py's own: it depends on what the trainer keeps beside vLLM.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from rl_factory.backends.verl.vllm_graphs import COMPILATION_CONFIG, capture_sizes

if TYPE_CHECKING:
    from rl_factory.backends.verl.tuning import Plan


def plan_engine(out: Plan, *, concurrency: int, max_num_seqs: int, max_num_batched_tokens: int,
                vllm_request_tokens: int, replica_gpus: int) -> None:
    """Set vLLM's engine keys on `out`. `vllm_request_tokens`: the most tokens one request can generate (0: the
    rollout is not vLLM); `concurrency`: the trajectories one replica decodes at once."""
    if vllm_request_tokens > 0:
        # verl's server reads only a request's final output, but vLLM's default (stream_interval=1) builds a
        # cumulative output for every request at every decode step and wakes verl's coroutine for it: Python
        # work in the server process on the order of the GPU's decode step at 128 requests. One interval as
        # long as a request sends the first token (verl's admission gate waits for it) and the final output.
        out.set("actor_rollout_ref.rollout.engine_kwargs.vllm.stream_interval", vllm_request_tokens,
                "vLLM streams a request's first token and its final output only: no per-step outputs that "
                "verl's server would discard")
        if replica_gpus == 1:
            # verl asks every server for vLLM's multiprocess executor; on one GPU that is one more process per
            # replica, started after the engine's own (spawn: Python, torch and vLLM imported again, a CUDA
            # context). vLLM's own default there, `uni`, runs the model in the engine core's process. Both in one
            # invocation (H100, 796e663c020c, benchmarks/ab.py): generation 1.94 s a step under `mp`, 1.95 under
            # `uni`; vLLM's servers started in 38.9 s under `uni`, 46.7 under `mp` (docs/guides/verl.md, "vLLM's
            # executor").
            out.set("actor_rollout_ref.rollout.engine_kwargs.vllm.distributed_executor_backend", "uni",
                    "one GPU a replica: vLLM's engine runs the model in its own process (vLLM's default there), "
                    "not in a worker process verl's `mp` would start after it")
            # vLLM's default compiles the model with torch.compile (Dynamo, then Inductor) at every server start
            # (verl turns vLLM's compile cache off, VLLM_DISABLE_COMPILE_CACHE=1, for a cache-corruption bug: vLLM
            # issue 31199) and captures CUDA graphs of the compiled pieces. On one GPU every step up to the largest
            # capture size is replayed as one full CUDA graph instead; what Inductor adds is fusing the elementwise
            # ops around the GEMMs, which vLLM's own CUDA kernels (RMSNorm, SiLU-and-mul, rotary) do without
            # compiling. Mixed steps in full graphs too: a multi-turn rollout adds each trajectory's next turn to
            # the running decode batch, about 15 such steps a rollout of the 0.6B shape, each run eager under
            # FULL_DECODE_ONLY (docs/guides/verl.md, "Full graphs for mixed steps").
            out.set("actor_rollout_ref.rollout.engine_kwargs.vllm.compilation_config", COMPILATION_CONFIG,
                    "no torch.compile at vLLM's start (with verl's compile cache off, every launch compiled: 14.5 s "
                    "of the 0.6B shape's server start on an H100): every step, a next turn's prompt beside the "
                    "decodes too, runs as one full CUDA graph over vLLM's own kernels")
    if concurrency > 0:
        full_mixed = vllm_request_tokens > 0 and replica_gpus == 1  # COMPILATION_CONFIG's graphs, tokens as sizes
        sizes = capture_sizes(concurrency, max_num_seqs, max_num_batched_tokens if full_mixed else 0)
        out.set("actor_rollout_ref.rollout.cudagraph_capture_sizes", sizes,
                f"CUDA graphs for the decode batches {concurrency} concurrent trajectories reach"
                + (" and the mixed steps that add a turn's prompt to them" if full_mixed else "")
                + ", instead of vLLM's ~50 sizes up to 512, each captured twice (full and piecewise) at start-up")
