"""The `tool/*` counters of a ToolEnv: every call the agent made, by tool and by failure kind.

`ToolEnv` records each result it returns (a reward's own calls are not recorded) and `ToolEnv.metrics()`
reads them back with its episodes' counters (`envs.episode.EpisodeStats`); the trainer resets them at
each logging step, so a step's metrics are that step's calls.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Container

from rl_factory.base.types import ToolResult

# Failures decided before any server is contacted: they carry no latency.
LOCAL_ERROR_KINDS = ("parse", "unknown_tool", "bad_arguments", "too_many_calls")
INVALID_TOOL_KEY = "_invalid"  # metrics bucket for names no server serves (keeps key count bounded)


class ToolMetrics:
    """Cumulative call counters since the last `reset()`."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self._counts: Counter[str] = Counter()
        self._latency_sum, self._latency_n, self._latency_max = 0.0, 0, 0.0

    def record(self, result: ToolResult, known: Container[str]) -> None:
        """Count one call's result; `known` holds the tool names some server serves (others are pooled)."""
        name = result.call.name if result.call.name in known else INVALID_TOOL_KEY
        self._counts["tool/calls"] += 1
        self._counts[f"tool/{name}/calls"] += 1
        if result.ok:
            self._counts["tool/successes"] += 1
        else:
            self._counts[f"tool/errors/{result.error_kind}"] += 1
            self._counts[f"tool/{name}/errors/{result.error_kind}"] += 1
        if result.cached:
            self._counts["tool/cache_hits"] += 1
            self._counts[f"tool/{name}/cache_hits"] += 1
        elif result.error_kind not in LOCAL_ERROR_KINDS:
            self._latency_sum += result.latency_s
            self._latency_n += 1
            self._latency_max = max(self._latency_max, result.latency_s)

    def metrics(self) -> dict[str, float]:
        """`tool/calls`, `tool/success_rate` (with calls), `tool/errors/<kind>`, `tool/<name>/calls`,
        `tool/<name>/errors/<kind>` (names no server serves pooled as `_invalid`), `tool/cache_hits` and
        `tool/<name>/cache_hits` (when a cache answered), `tool/latency_s/mean` and `/max` over calls that
        reached a server."""
        out = {k: float(v) for k, v in self._counts.items() if k != "tool/successes"}
        out["tool/calls"] = float(self._counts["tool/calls"])
        if self._counts["tool/calls"]:
            out["tool/success_rate"] = self._counts["tool/successes"] / self._counts["tool/calls"]
        if self._latency_n:
            out["tool/latency_s/mean"] = self._latency_sum / self._latency_n
            out["tool/latency_s/max"] = self._latency_max
        return out
