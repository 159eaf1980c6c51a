"""The calculator reward for verl's own tool loop (a plain verl `compute_score`).

verl hands its reward the decoded response with tool observations inside; the model's final answer is
what follows the last tool response, scored by the same rule as our `numeric_exact_match`.
"""
from __future__ import annotations

from typing import Any

from rewards.exact_match import numeric_exact_match


def compute_score(data_source: str = None, solution_str: str = "", ground_truth: str = "", extra_info: Any = None,
                  **_: Any) -> float:
    final = solution_str.rsplit("</tool_response>", 1)[-1]
    return numeric_exact_match(final, ground_truth)
