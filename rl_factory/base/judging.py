"""The pairwise judge as the tournament sees it, and the one error a judge raises.

Bottom layer, beside `types`, `registry` and `errors`: `rl_factory.algorithms` catches `JudgeError`
(its `on_judge_failure` policy) and the judges in `rewards` raise it, so the tournament math never
imports `rewards`.
"""
from __future__ import annotations

from typing import Any, Protocol


class JudgeError(RuntimeError):
    """A judge could not produce a verdict (after its retries)."""


class PairwiseJudge(Protocol):
    """`rewards.judge.build_judge` returns one: `compare` gives P(a beats b) for two candidates."""

    async def compare(self, query: str, a: Any, b: Any) -> float: ...

    async def aclose(self) -> None: ...
