"""Token faithfulness: the ids trained are the ids sampled, and the masks cover exactly the generated spans.

Per trajectory, the digest of every loss-masked run of every training sample must be the digest of a turn
the engine generated (its receipt), and every generated turn must be trained. A trajectory whose tokens
were re-encoded from text, cut, shifted or masked past its generated spans fails one side or the other.
Trajectories from an engine that writes no receipts (a scripted test engine) are counted, not judged.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rl_factory.guard.registry import Action, Check, StepData, register_check


@dataclass
class TokensConfig:
    action: Action = "stop"
    # trajectories per step allowed to fail before the check fires (0: any one)
    max_mismatched: int = 0


@register_check("tokens")
class TokensCheck(Check):
    config = TokensConfig

    def evaluate(self, data: StepData):
        mismatched, uncovered, unreceipted, first = [], [], 0, None
        for i, ev in enumerate(data.trajectories):
            engine = ev.get("engine") or []
            if not engine or any(d is None for d in engine):
                unreceipted += 1
                continue
            sampled, trained = set(engine), set(ev.get("trained") or [])
            if trained - sampled:
                mismatched.append(i)
                first = first or _describe(ev, "trains ids the engine did not sample")
            elif sampled - trained:
                uncovered.append(i)
                first = first or _describe(ev, "leaves generated ids out of the loss mask")
        metrics = {"guard/tokens/mismatched": float(len(mismatched)), "guard/tokens/uncovered": float(len(uncovered)),
                   "guard/tokens/unreceipted": float(unreceipted)}
        bad = mismatched + uncovered
        if len(bad) <= self.cfg.max_mismatched:
            return metrics, None
        message = (f"{len(bad)} of {len(data.trajectories)} trajectories differ between sampled and trained ids "
                   f"({len(mismatched)} train ids never sampled, {len(uncovered)} leave sampled ids untrained); "
                   f"first: {first}")
        return metrics, self.finding(data, message, bad)


def _describe(ev: dict[str, Any], what: str) -> str:
    return (f"sample {ev.get('sample_index')} {what} ({ev.get('trained_tokens')} tokens under the loss mask, "
            f"{ev.get('generated_tokens')} generated)")
