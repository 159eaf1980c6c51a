"""How a join's prompts are split into prefill forwards (the embedded engine's `_Batch.join`).

Each forward pads its prompts to the longest of them and costs a fixed amount besides: one long
observation padding every row of a join (a parse error's ~85 tokens beside ~20) had cost 3.9x the
tokens, one forward per prompt costs the fixed part many times. The cut is searched exactly.
"""
from __future__ import annotations

# What one more prefill forward costs beyond its padded tokens, in query tokens (the tiny model on the 2-core
# VM: ~3 ms a forward, ~30 us a padded token).
PREFILL_FORWARD_COST_TOKENS = 96


def prefill_runs(lengths: list[int], min_rows: int) -> list[tuple[int, int]]:
    """Cut prompts sorted by length into runs [a, b) whose padded tokens plus a per-forward cost are least.

    A run of r prompts is padded to its longest, and to at least max(4, ceil(min_rows / r)) queries (what
    keeps the kernels batch-invariant), so the cut points alone never change a row's bits. Runs are cut
    only where the length changes (a join has few distinct lengths), an exact search over those.
    """
    edges = [0] + [i for i in range(1, len(lengths)) if lengths[i] != lengths[i - 1]] + [len(lengths)]
    best, cut = {0: 0}, {}
    for j in range(1, len(edges)):
        end, width = edges[j], lengths[edges[j] - 1]
        for start in edges[:j]:
            rows = end - start
            cost = best[start] + rows * max(width, 4, -(-min_rows // rows)) + PREFILL_FORWARD_COST_TOKENS
            if end not in best or cost < best[end]:
                best[end], cut[end] = cost, start
    runs, end = [], len(lengths)
    while end:
        runs.append((cut[end], end))
        end = cut[end]
    return runs[::-1]
