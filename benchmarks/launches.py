"""One gpu_step.py record over two launches of the same job: `--earlier RESULTS` joins this launch with the newest
record in RESULTS (a gpu_step.jsonl) of the same job on the same GPU model.

A launch's steady steps vary with what the machine did while it started (vLLM's graphs, the allocator's first
segments), so one launch's medians can sit apart from the next one's. The joined record's headline numbers are the
medians of the measured steps of both launches together (each launch's own `per_step`), its ratios those medians
against this launch's ceilings (or the earlier launch's, where only that one measured them: `ceilings_from`);
`this_launch` keeps this launch's own, `earlier_invocation` names the other's date, commit and command. Two launches
rarely fit one 10-minute device call, so each runs in a call of its own.
"""
from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any

from benchmarks.ceilings import ratios
from benchmarks.record import boot_id
from rl_factory.jsonl import read_records

# what makes two launches the same job (the command line may differ in --out, --timeout and --earlier)
SAME_JOB = ("model", "shape", "agent_loop", "lora_rank", "gpus", "tp", "batch", "n", "steps", "measured_steps", "job",
            "overrides", "startup_variant")
PHASES = ("generate", "old_log_prob", "update", "update_weights")


ROOT = Path(__file__).resolve().parents[1]


def job_differences(a: dict[str, Any], b: dict[str, Any]) -> dict[str, list[Any]]:
    """What makes two gpu_step records two jobs: each differing key of SAME_JOB (the model as one file) and whether
    vLLM was asked for log-probs, as [a's, b's]; empty for one job."""
    def model(r: dict[str, Any]) -> str | None:
        path = r.get("model")
        return str((ROOT / path).resolve()) if path else None  # an absolute path stays itself

    def logprobs(r: dict[str, Any]) -> bool:  # whether its measured rollouts asked vLLM for log-probs (gpu_step.py)
        return ((r.get("phases") or {}).get("generate") or {}).get("sampling_logprobs", True)

    pairs = {"model": (model(a), model(b)), "sampling_logprobs": (logprobs(a), logprobs(b)),
             **{key: (a.get(key), b.get(key)) for key in SAME_JOB if key != "model"}}
    return {key: list(pair) for key, pair in pairs.items() if pair[0] != pair[1]}


def same_job(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two gpu_step records ran one job: SAME_JOB's keys equal, the model's path as one file (`--out
    outputs/gpu_suite` and ab.py's absolute `<checkout>/outputs/gpu_suite` name the same weights), and vLLM asked
    for log-probs in both or in neither."""
    return not job_differences(a, b)


def newest_on(gpu: str | None, results: Path) -> dict[str, Any] | None:
    """The newest gpu_step record in `results` on the GPU model `gpu`, of whatever job."""
    lines = read_records(results)
    return next((line for line in reversed(lines) if line.get("benchmark") == "gpu_step"
                 and (line.get("machine") or {}).get("gpu") == gpu), None)


def one_boot(earlier: dict[str, Any], result: dict[str, Any]) -> bool:
    """False where `earlier` ran on another machine than `result` (its `machine.boot_id`, else this machine's: a
    launch's result is joined before emit adds its machine): two hosts of one GPU model are not two launches of one
    job (hosts of one model differed by a third in step time). A record without a boot id is let be."""
    mine = (result.get("machine") or {}).get("boot_id") or boot_id()
    theirs = (earlier.get("machine") or {}).get("boot_id")
    return not (mine and theirs) or mine == theirs


def earlier_launch(result: dict[str, Any], gpu: str | None, results: Path) -> dict[str, Any] | None:
    """The newest gpu_step record in `results` of the job `result` ran, on the GPU model `gpu` and the same machine
    (`one_boot`), that has per-step numbers (a record made before they were kept cannot be joined)."""
    lines = read_records(results)
    for line in reversed(lines):
        if (line.get("benchmark") == "gpu_step" and (line.get("machine") or {}).get("gpu") == gpu
                and same_job(line, result) and line.get("per_step") and line.get("date") != result.get("date")
                and one_boot(line, result)):
            return line
    return None


def with_earlier(result: dict[str, Any], gpu: str | None, results: Path) -> dict[str, Any]:
    """`result` joined with the newest launch of its job in `results` on `gpu`; where there is none, `result` as one
    launch (`earlier_missing`), and what made the newest launch there another job (`earlier_differs`, also said on
    stderr at once: an override given to one launch only makes two jobs)."""
    earlier = earlier_launch(result, gpu, results)
    if earlier:
        return join(result, earlier)
    newest = newest_on(gpu, results)
    differs = job_differences(newest, result) if newest else {}
    print(f"gpu_step: --earlier {results}: no launch of this job on {gpu}"
          + (f"; the newest there differs in {json.dumps(differs)}" if differs else ""), file=sys.stderr)
    return {**result, "launches": 1, "earlier_missing": str(results),
            **({"earlier_differs": differs} if differs else {})}


def join(result: dict[str, Any], earlier: dict[str, Any]) -> dict[str, Any]:
    """`result` with its headline numbers over both launches (see the module docstring)."""
    both = {name: [*earlier["per_step"][name], *result["per_step"][name]] for name in result["per_step"]}
    medians = {name: statistics.median(values) for name, values in both.items() if values}
    tokens = statistics.fmean(both["total_tokens"]) if both.get("total_tokens") else None
    generated = [r["phases"]["generate"].get("generated_tokens") for r in (earlier, result)]
    generated_tokens = statistics.fmean(generated) if all(g is not None for g in generated) else None
    phases = {name: dict(result["phases"][name]) for name in PHASES}
    for name in PHASES:
        phases[name]["s"] = medians.get(name)
    phases["generate"]["tokens_per_s"] = generated_tokens / medians["generate"] if generated_tokens else None
    for name in ("old_log_prob", "update"):
        phases[name]["tokens_per_s"] = tokens / medians[name] if tokens and medians.get(name) else None
    joined = {**result, "launches": 2, "step_s": medians["step"], "phases": {**result["phases"], **phases},
              "this_launch": {key: result[key] for key in ("step_s", "phases", "ratio_to_ceiling") if key in result},
              "earlier_invocation": {key: earlier.get(key) for key in ("date", "commit", "command", "step_s")}}
    ceilings = result.get("ceilings") or {}
    if "vllm_generate" not in ceilings and "vllm_generate" in (earlier.get("ceilings") or {}):
        # a launch without ceilings (gpu_suite.sh ours_shape) joined with one that measured them on the same job:
        # the medians over both against those
        ceilings = earlier["ceilings"]
        joined.update(ceilings=ceilings, ceilings_from="earlier_invocation")
    if "vllm_generate" in ceilings:
        joined["ratio_to_ceiling"] = ratios(joined["phases"], medians["step"], ceilings["vllm_generate"], ceilings,
                                            ceilings.get("vllm_configured"))
    return joined


def join_newest(results: Path) -> dict[str, Any]:
    """The newest gpu_step record of `results` joined with the launch before it of the same job on the same GPU
    model: what `gpu_step.py --earlier` would have printed, for a launch whose call named no --earlier or missed
    its earlier record. The newest record's own date, commit, machine and command stay; `joined_by` says how."""
    newest = next((r for r in reversed(read_records(results)) if r.get("benchmark") == "gpu_step"), None)
    if newest is None:
        raise SystemExit(f"{results}: no gpu_step record to join")
    newest = {k: v for k, v in newest.items() if k not in ("launches", "earlier_missing", "earlier_differs")}
    earlier = earlier_launch(newest, (newest.get("machine") or {}).get("gpu"), results)
    if earlier is None:
        raise SystemExit(f"{results}: no earlier launch of the newest record's job on {newest.get('machine')}")
    return {**join(newest, earlier), "joined_by": f"python -m benchmarks.launches {results.name}"}


if __name__ == "__main__":
    import argparse

    from benchmarks.record import append

    ap = argparse.ArgumentParser(description="Join the newest gpu_step record with the earlier launch of its job: "
                                 "the joined record is appended to the same file and printed")
    ap.add_argument("results", type=Path, help="a gpu_step.jsonl")
    path = ap.parse_args().results
    joined = join_newest(path)
    append("gpu_step", joined, path.parent)  # its own provenance, not this machine's: not record.emit
    print(json.dumps(joined))
