"""The reward channel: constant rewards, rewards outside their range, rewards blind to the completion,
and reward or data files changed while the run reads them.

- `reward_constant`: every trajectory of the batch got the same reward for `steps` steps in a row (no group
  has an advantage: nothing trains).
- `reward_range`: a reward that is not finite, or outside the declared `[min, max]`.
- `reward_probe`: from time to time the guard scores another sample's trajectory (its completion, calls and
  results) against this sample's answer (rl_factory/guard/probes.py). A pair is chosen so that the two
  rewards differ; a reward that reads the completion almost always changes, one that ignores it never does.
  `probes` such probes in a row that changed nothing fire.
- `reward_files`: the reward's source files and the dataset files, fingerprinted when the run starts
  (size, modification time, and the content hash of the reward's files); any change fires.
"""
from __future__ import annotations

from dataclasses import dataclass

from rl_factory.guard.registry import Action, Check, StepData, register_check


@dataclass
class RewardConstantConfig:
    action: Action = "stop"
    # steps in a row whose whole batch got one and the same reward
    steps: int = 5


@dataclass
class RewardRangeConfig:
    action: Action = "stop"
    # the declared range of a trajectory's reward; null: any finite number
    min: float | None = None
    max: float | None = None


@dataclass
class RewardProbeConfig:
    action: Action = "stop"
    # probe every N steps (0: never), with up to `per_step` pairs each time
    every: int = 2
    per_step: int = 2
    # this many probes in a row whose reward did not change fire
    probes: int = 4


@dataclass
class RewardFilesConfig:
    action: Action = "stop"


@register_check("reward_constant")
class RewardConstantCheck(Check):
    config = RewardConstantConfig

    def evaluate(self, data: StepData):
        rewards = [ev.get("reward") for ev in data.trajectories]
        if data.partial:  # a handful of lines says nothing of the batch: the streak holds
            return {"guard/reward_constant/streak": float(self.state.get("streak", 0))}, None
        constant = len(rewards) > 1 and len(set(rewards)) == 1
        self.state["streak"] = self.state.get("streak", 0) + 1 if constant else 0
        metrics = {"guard/reward_constant/streak": float(self.state["streak"])}
        if self.state["streak"] < self.cfg.steps:
            return metrics, None
        return metrics, self.finding(data, (
            f"every trajectory of the batch got reward {rewards[0]} for {self.state['streak']} steps in a row "
            f"({len(rewards)} this step): no group has an advantage"), list(range(len(rewards))))


@register_check("reward_range")
class RewardRangeCheck(Check):
    config = RewardRangeConfig

    def evaluate(self, data: StepData):
        lo, hi = self.cfg.min, self.cfg.max
        bad = [i for i, ev in enumerate(data.trajectories) if not ev.get("reward_finite", True)
               or (ev.get("reward") is not None and ((lo is not None and ev["reward"] < lo)
                                                     or (hi is not None and ev["reward"] > hi)))]
        metrics = {"guard/reward_range/outside": float(len(bad))}
        if not bad:
            return metrics, None
        ev = data.trajectories[bad[0]]
        value = ev.get("reward") if ev.get("reward_finite", True) else "non-finite"
        return metrics, self.finding(data, (
            f"{len(bad)} reward(s) outside the declared range [{lo}, {hi}]; sample {ev.get('sample_index')} "
            f"got {value}"), bad)


@register_check("reward_probe")
class RewardProbeCheck(Check):
    config = RewardProbeConfig

    def evaluate(self, data: StepData):
        unchanged = self.state.get("unchanged", 0)
        for probe in data.probes:
            unchanged = unchanged + 1 if abs(probe["probe"] - probe["reward"]) <= 1e-9 else 0
        self.state["unchanged"] = unchanged
        metrics = {"guard/reward_probe/unchanged": float(unchanged)} if data.probes else {}
        if unchanged < self.cfg.probes or not data.probes:
            return metrics, None
        p = data.probes[-1]
        return metrics, self.finding(data, (
            f"{unchanged} probes in a row scored another sample's completion against this sample's answer and "
            f"the reward did not change (last: sample {p['sample_index']} reward {p['reward']:g}, with sample "
            f"{p['other_index']}'s completion {p['probe']:g}): the reward does not read the completion"),
            [p["position"], p["other_position"]])


@register_check("reward_files")
class RewardFilesCheck(Check):
    config = RewardFilesConfig

    def evaluate(self, data: StepData):
        start = self.state.setdefault("start", dict(data.files))
        changed = sorted(p for p, fp in data.files.items() if p in start and start[p] != fp)
        metrics = {"guard/reward_files/changed": float(len(changed))}
        if not changed:
            return metrics, None
        return metrics, self.finding(data, (
            f"{len(changed)} file(s) the run reads changed since it started: {', '.join(changed[:3])} "
            f"(fingerprint {start[changed[0]]} -> {data.files[changed[0]]})"))
