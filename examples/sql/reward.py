"""The SQL example's reward: are the table's rows, in the trajectory's own database, what the task asked for?

The reward runs the sample's `check_sql` through `tools`, which calls the trajectory's own episode (its
`run_sql` server, still open when the reward runs), so it reads the rows this trajectory left behind, not
the file the sample ships or another trajectory's copy. 1.0 when they equal `expected` (the whole table:
a wrong row, a duplicate or a lost row all fail), else 0.0. `wrote` (in reward_info) says whether the
agent ran a statement that changed anything, which separates "did not try" from "got it wrong".
"""
from __future__ import annotations


async def reward(tools, check_sql: str, expected: str, tool_calls: list, tool_results: list, **_) -> dict:
    result = await tools.call("run_sql", {"sql": check_sql})
    rows_now = "\n".join(result.text.splitlines()[1:]) if result.ok else None
    wrote = any(r["ok"] and r["text"].startswith("OK,") and not r["text"].startswith("OK, 0 ")
                for r in tool_results)
    return {"score": float(rows_now == expected), "wrote": float(wrote), "check_failed": float(not result.ok)}
