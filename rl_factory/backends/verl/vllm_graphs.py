"""vLLM's compilation and CUDA graphs for a rollout replica on one GPU: what tuning.py plans for them.

vLLM replays a step as one CUDA graph where a graph of its size was captured at start-up, and launches each of the
model's kernels from Python where none was: a small model's steps are bound by those launches (vLLM's engine core
kept one CPU core busy through the 0.6B shape's rollouts, benchmarks/host_cpu.py). Under full graphs
(`cudagraph_mode=FULL`) a graph's size is the step's tokens, decode and prompt tokens together; the sizes here cover
the decode batches a rollout reaches and the mixed steps that add a trajectory's next turn to them.
"""
from __future__ import annotations

# vLLM's compilation for a one-GPU replica: no torch.compile, full CUDA graphs for every batch up to the largest
# capture size, mixed (prompt and decode) batches too (a JSON string: verl's server json-loads a string and merges
# its own cudagraph_mode default into a dict). An attention backend that cannot replay mixed batches in a full graph
# (FlashAttention 2, FlashInfer) makes vLLM fall back to FULL_DECODE_ONLY, with a warning in its log.
COMPILATION_CONFIG = '{"mode": "NONE", "cudagraph_mode": "FULL"}'
# The capture sizes of mixed batches, in tokens: a mixed step carries the decode batch and the prompts that arrived
# since the step before (a trajectory's next turn: its tool result, the rest from the prefix cache). In the 0.6B
# shape's rollouts (16 x 8, five rollouts, H200, vLLM's iteration log) 75 of 76 mixed steps carried at most 1024
# tokens; the other was a rollout's first prefill (127 prompts at once), which runs eager. 8x the decode batch, at
# least 1024, at most vLLM's max_num_batched_tokens.
MIXED_GRAPH_TOKENS = 1024
MIXED_GRAPH_FACTOR = 8


def capture_sizes(concurrency: int, max_num_seqs: int, max_num_batched_tokens: int = 0) -> list[int]:
    """Powers of two up to the decode batch the rollout can reach (at most vLLM's max_num_seqs); with
    `max_num_batched_tokens` (full graphs for mixed batches), on up to the mixed batches' tokens
    (MIXED_GRAPH_FACTOR x that batch, at least MIXED_GRAPH_TOKENS, at most max_num_batched_tokens)."""
    top = min(max_num_seqs, 1 << max(0, concurrency - 1).bit_length())
    sizes = [1 << k for k in range(top.bit_length()) if 1 << k <= top]
    sizes = sizes if sizes[-1] == top else [*sizes, top]
    mixed = min(max_num_batched_tokens, max(MIXED_GRAPH_TOKENS, MIXED_GRAPH_FACTOR * top))
    return [*sizes, *(1 << k for k in range(top.bit_length(), mixed.bit_length()) if top < 1 << k <= mixed)]
