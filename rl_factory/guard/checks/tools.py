"""Tools that stop firing: tool-call, parse-failure and per-tool error rates against a baseline.

The baseline is the doctor's parser round trip (rl_factory/doctor/template.py: does the parser read back the
calls the chat template writes?), taken when the guard starts, and the mean of the first `baseline_steps`
steps. A run with tools whose parser cannot read the template's calls fires as soon as a step makes no call;
later, a call rate that falls under `min_call_ratio` of its baseline, or a parse-failure or per-tool error rate
that rises `max_rise` above its own, fires. "Reward rising while tool calls are zero" is its own check
(`reward_without_tools`): the signature of a run that learned to answer without the tools it was meant to use.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rl_factory.guard.registry import Action, Check, StepData, register_check


@dataclass
class ToolsConfig:
    action: Action = "warn"
    # steps whose rates make the baseline
    baseline_steps: int = 3
    # a call rate under this share of its baseline fires (baselines under min_baseline_rate are not judged)
    min_call_ratio: float = 0.25
    min_baseline_rate: float = 0.1
    # a parse-failure or per-tool error rate this far above its baseline fires (tools with min_calls calls)
    max_rise: float = 0.3
    min_calls: int = 5


@dataclass
class RewardWithoutToolsConfig:
    action: Action = "warn"
    # steps that make the reward baseline
    baseline_steps: int = 3
    # steps in a row without any tool call, each with the mean reward this far above the baseline, fire
    steps: int = 3
    min_rise: float = 0.1


def step_rates(trajectories: list[dict[str, Any]]) -> dict[str, Any]:
    """Call rate (trajectories with a call), parse-failure rate (of calls), per-tool [calls, errors]."""
    calls = sum(ev.get("tool_calls", 0) for ev in trajectories)
    per_tool: dict[str, list[int]] = {}
    for ev in trajectories:
        for name, (n, errors) in (ev.get("tool_errors") or {}).items():
            entry = per_tool.setdefault(name, [0, 0])
            entry[0] += n
            entry[1] += errors
    return {"call_rate": sum(ev.get("tool_calls", 0) > 0 for ev in trajectories) / max(1, len(trajectories)),
            "parse_rate": sum(ev.get("parse_errors", 0) for ev in trajectories) / calls if calls else 0.0,
            "calls": calls, "per_tool": per_tool}


@register_check("tools")
class ToolsCheck(Check):
    config = ToolsConfig

    def evaluate(self, data: StepData):
        rates = step_rates(data.trajectories)
        metrics = {"guard/tools/call_rate": rates["call_rate"], "guard/tools/parse_failure_rate": rates["parse_rate"]}
        if not self.state.get("has_tools", True) or data.partial:
            return metrics, None
        doctor = self.state.get("doctor") or {}
        if rates["calls"] == 0 and doctor.get("ok") is False:
            return metrics, self.finding(data, (
                f"no tool call in {len(data.trajectories)} trajectories, and the doctor's parser round trip fails: "
                f"{doctor.get('detail', '')[:240]} (fix: {doctor.get('fix', '')})"))
        seen = self.state.setdefault("seen", [])
        if len(seen) < self.cfg.baseline_steps:
            seen.append({"call_rate": rates["call_rate"], "parse_rate": rates["parse_rate"],
                         "per_tool": {k: v[1] / v[0] for k, v in rates["per_tool"].items() if v[0]}})
            return metrics, None
        base_call = sum(s["call_rate"] for s in seen) / len(seen)
        base_parse = sum(s["parse_rate"] for s in seen) / len(seen)
        metrics["guard/tools/call_rate/baseline"] = base_call
        if base_call >= self.cfg.min_baseline_rate and rates["call_rate"] < base_call * self.cfg.min_call_ratio:
            return metrics, self.finding(data, (
                f"tool-call rate {rates['call_rate']:.3g} fell under {self.cfg.min_call_ratio:g}x its baseline "
                f"{base_call:.3g} (first {len(seen)} steps)"))
        if rates["calls"] >= self.cfg.min_calls and rates["parse_rate"] > base_parse + self.cfg.max_rise:
            return metrics, self.finding(data, (
                f"parse-failure rate {rates['parse_rate']:.3g} of {rates['calls']} calls, baseline {base_parse:.3g}"))
        for name, (n, errors) in sorted(rates["per_tool"].items()):
            base = [s["per_tool"][name] for s in seen if name in s["per_tool"]]
            base_rate = sum(base) / len(base) if base else 0.0
            if n >= self.cfg.min_calls and errors / n > base_rate + self.cfg.max_rise:
                return metrics, self.finding(data, (
                    f"tool {name}: error rate {errors / n:.3g} of {n} calls, baseline {base_rate:.3g}"))
        return metrics, None


@register_check("reward_without_tools")
class RewardWithoutToolsCheck(Check):
    config = RewardWithoutToolsConfig

    def evaluate(self, data: StepData):
        rewards = [ev["reward"] for ev in data.trajectories if ev.get("reward") is not None]
        if not rewards or not self.state.get("has_tools", True) or data.partial:
            return {}, None
        mean = sum(rewards) / len(rewards)
        seen = self.state.setdefault("seen", [])
        if len(seen) < self.cfg.baseline_steps:
            seen.append(mean)
            return {}, None
        baseline = sum(seen) / len(seen)
        silent = step_rates(data.trajectories)["calls"] == 0 and mean > baseline + self.cfg.min_rise
        self.state["streak"] = self.state.get("streak", 0) + 1 if silent else 0
        metrics = {"guard/reward_without_tools/streak": float(self.state["streak"])}
        if self.state["streak"] < self.cfg.steps:
            return metrics, None
        return metrics, self.finding(data, (
            f"mean reward {mean:.3g} is above its baseline {baseline:.3g} while no tool was called for "
            f"{self.state['streak']} steps in a row"))
