"""Policy version receipts: the weights that produced each rollout are the weights the trainer expects.

The engine stamps every generated turn with the policy version it last synced to and, where it can, a
fingerprint of the weights it generates with (`weight_fingerprint` of its own model: rl_factory/guard/fingerprint.py).
The trainer syncs the engine after each update (embedded: `HFEngine.sync`; verl: the vLLM server's `global_steps`,
set when `update_weights` lands) and expects the rollouts of step s to come from version s - 1 (up to
`max_staleness` older) and, where it knows its own fingerprint for that version, from those weights. An
engine that keeps the initial weights (a copy made at start, an adapter never applied, a sync that never
lands) reports an old version or the old fingerprint.

Under LoRA the parameters alone do not say what the engine generates with: an engine that samples with the
adapter disabled (peft's `disable_adapter()`, another adapter active, a changed scaling) holds the very
tensors the trainer trains. So a fingerprint of a peft model also holds the adapter's state, layer by layer
(`adapter_key`: enabled, active adapters, merged, scaling), and the embedded engine reads that state inside
each of its forwards (rl_factory/engines/hf_batch.py): a turn generated with the adapter in another state than
the one synced carries another fingerprint. Reading it costs microseconds per forward (28 adapted layers:
10 us; 252: 96 us), against a logits probe that would cost a forward per step and a tolerance that bf16 noise
and an adapter's first small updates would both fall inside (docs/guides/guard.md, "How the receipts work").
"""
from __future__ import annotations

from dataclasses import dataclass

from rl_factory.guard.registry import Action, Check, StepData, register_check
from rl_factory.guard.syncs import unlanded


@dataclass
class ReceiptsConfig:
    action: Action = "stop"
    # versions a rollout may lag behind the trainer (0: on-policy; async trainers allow more)
    max_staleness: int = 0


@register_check("receipts")
class ReceiptsCheck(Check):
    config = ReceiptsConfig

    def _oldest(self, ev: dict, expected: int) -> int:
        """The oldest version a trajectory may carry: its own (`oldest_version`: verl, the version synced before its
        prompt was queued), else `max_staleness` before the version the trainer expects."""
        oldest = ev.get("oldest_version")
        return oldest if isinstance(oldest, int) else expected - self.cfg.max_staleness

    def evaluate(self, data: StepData):
        expected, weights = data.expected.get("version"), data.expected.get("weights") or {}
        newest = data.expected.get("newest", expected)
        stale, wrong, unknown, seen = [], [], 0, []
        for i, ev in enumerate(data.trajectories):
            versions = [v for v in ev.get("versions") or [] if v is not None]
            if not versions:
                unknown += 1
                continue
            seen += versions
            if expected is not None and any(not self._oldest(ev, expected) <= v <= newest for v in versions):
                stale.append(i)
                continue
            marks = [(v, w) for v, w in zip(ev.get("versions") or [], ev.get("weights") or []) if w is not None]
            if any(str(v) in weights and weights[str(v)] != w for v, w in marks):
                wrong.append(i)
        metrics = {"guard/receipts/stale": float(len(stale)), "guard/receipts/weights_mismatch": float(len(wrong)),
                   "guard/receipts/unknown": float(unknown)}
        if seen:
            metrics["guard/receipts/version"] = float(max(seen))
        if data.syncs:  # the engine's own receipts of its weight syncs (verl + vLLM: rl_factory/guard/syncs.py)
            missed = [line for line in data.syncs if unlanded(line)]
            metrics.update({"guard/receipts/engine_syncs": float(len(data.syncs)),
                            "guard/receipts/engine_unlanded": float(len(missed))})
            # the longest sync a worker took, and the longest time its receipts took inside one
            for key, field in (("engine_sync_s", "seconds"), ("cost_s", "receipts_seconds")):
                times = [float(line[field]) for line in data.syncs if isinstance(line.get(field), (int, float))]
                if times:
                    metrics[f"guard/receipts/{key}"] = max(times)
            if missed:
                first = missed[0]
                return metrics, self.finding(data, (
                    f"{len(missed)} of {len(data.syncs)} weight syncs left the engine's weights as they were: sync "
                    f"{first.get('sync')} of engine {first.get('engine')} was sent {first.get('tensors')} new tensors "
                    f"(fingerprint {first.get('received')}) and the weights it generates with stayed "
                    f"{first.get('held_after')}: the weight sync does not reach the engine"), [])
        if stale:
            got = sorted({v for i in stale for v in data.trajectories[i]["versions"] if v is not None})
            oldest = self._oldest(data.trajectories[stale[0]], expected)
            allowed = f"{oldest}" if oldest == newest else f"{oldest} to {newest}"
            return metrics, self.finding(data, (
                f"{len(stale)} of {len(data.trajectories)} trajectories were generated by policy version(s) {got[:4]}, "
                f"the trainer expects {allowed} (max_staleness {self.cfg.max_staleness}): the weight sync did not "
                "reach the engine"), stale)
        if wrong:
            ev = data.trajectories[wrong[0]]
            v, w = next((v, w) for v, w in zip(ev["versions"], ev["weights"]) if w is not None and str(v) in weights)
            return metrics, self.finding(data, _mismatch(len(wrong), len(data.trajectories), v, w, weights[str(v)],
                                                         data.expected.get("resumed")), wrong)
        return metrics, None


def _mismatch(wrong: int, total: int, version, got: str, want: str, resumed: dict | None) -> str:
    """The line for receipts whose fingerprint is not the trainer's: the adapter's state when only it differs."""
    head = f"{wrong} of {total} trajectories were generated with weights {got} at version {version}"
    if resumed and str(resumed.get("version")) == str(version) and resumed.get("saved") == want:
        return (f"{head}; the checkpoint the run resumed from saved weights {want} at that version: the weights "
                f"loaded back on resume ({resumed.get('loaded')}) are not the weights saved")
    same, got_lora, want_lora = got.split("+")[0] == want.split("+")[0], _lora(got), _lora(want)
    if same and got_lora != want_lora:
        return (f"{head}: the trainer's tensors, but {got_lora} where the trainer's model has {want_lora}: the "
                "engine generates with the LoRA adapter disabled or in another state (active adapter, scaling, "
                "merge), so it does not generate with the weights being trained")
    return (f"{head}; the trainer's weights of that version are {want}: the engine does not generate with the "
            "weights being trained")


def _lora(fingerprint: str) -> str:
    part = fingerprint.partition("+lora")[2]
    if not part:
        return "no adapter layers"
    counts, _, state = part.partition(".")
    enabled, _, total = counts.partition("/")
    return f"{enabled} of {total} adapter layers enabled (state {state})"
