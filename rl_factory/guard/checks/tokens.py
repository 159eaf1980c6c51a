"""Token faithfulness: the ids trained are the ids sampled, and the masks cover exactly the generated spans.

Per trajectory, the digest of every loss-masked run of every training sample must be the digest of a turn
the engine generated (its receipt), and every generated turn must be trained. A trajectory whose tokens
were re-encoded from text, cut, shifted or masked past its generated spans fails one side or the other.
Trajectories from an engine that writes no receipts (a scripted test engine) are counted, not judged.

The trained side is the update's own (embedded: the trajectory the trainer trains; verl: the rows of the batch
the actor is handed, `trained_in: "actor batch"`, rl_factory/backends/verl/trained.py). On verl a trajectory that
no update has trained yet (`trained: null`: an async trainer trains it at a later step, whose `late` evidence
then holds it; dynamic sampling evicted its group) is counted, not judged; one that the rollout filters dropped
(`dropped_by`) must train no token at all.
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
        mismatched, uncovered, unreceipted, untrained, batch, first = [], [], 0, 0, 0, None
        judged = data.trajectories + data.late  # positions past the step's own are its late ones
        for i, ev in enumerate(judged):
            if ev.get("trained", []) is None:
                untrained += 1
                continue
            batch += ev.get("trained_in") == "actor batch"
            trained = set(ev.get("trained") or [])
            if ev.get("dropped_by"):  # the filters dropped it: the mask must cover nothing
                if trained:
                    mismatched.append(i)
                    first = first or _describe(ev, f"was dropped ({ev['dropped_by']}) but trains tokens")
                continue
            engine = ev.get("engine") or []
            if not engine or any(d is None for d in engine):
                unreceipted += 1
                continue
            sampled = set(engine)
            if trained - sampled:
                mismatched.append(i)
                first = first or _describe(ev, "trains ids the engine did not sample")
            elif sampled - trained:
                uncovered.append(i)
                first = first or _describe(ev, "leaves generated ids out of the loss mask")
        metrics = {"guard/tokens/mismatched": float(len(mismatched)), "guard/tokens/uncovered": float(len(uncovered)),
                   "guard/tokens/unreceipted": float(unreceipted)}
        if batch or untrained:  # verl: judged on the actor's batch
            metrics.update({"guard/tokens/from_batch": float(batch), "guard/tokens/untrained": float(untrained)})
        bad = mismatched + uncovered
        if len(bad) <= self.cfg.max_mismatched:
            return metrics, None
        message = (f"{len(bad)} of {len(judged)} trajectories differ between sampled and trained ids "
                   f"({len(mismatched)} train ids never sampled, {len(uncovered)} leave sampled ids untrained); "
                   f"first: {first}")
        return metrics, self.finding(data, message, bad)


def _describe(ev: dict[str, Any], what: str) -> str:
    where = " in the actor's batch" if ev.get("trained_in") == "actor batch" else ""
    session = f" session {ev['session']}" if ev.get("session") is not None else ""
    step = f" (rolled out at step {ev['rolled_out']})" if ev.get("rolled_out") is not None else ""
    return (f"sample {ev.get('sample_index')}{session}{step} {what} ({ev.get('trained_tokens')} tokens under the "
            f"loss mask{where}, {ev.get('generated_tokens')} generated)")
