"""The benchmarks page's table of where one GPU stands against its targets, one row per shape and GPU model.

Per shape and GPU model: ours' newest `gpu_step` record of the default job (trl_shapes.ours_matches) whose phases
were set beside ceilings (`ratio_to_ceiling`: measured in the same invocation, or the earlier launch's it was joined
with), a launch joined with the one before it over that launch alone; each phase beside its ceiling with the
target it is held to, and TRL's step from the same machine (trl_shapes.beside) where it ran there.

    .venv/bin/python -m docsgen.gpu_targets benchmarks/results   # the table, printed
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from docsgen import trl_shapes
from docsgen.records import fmt, get, load, machine_text

# (ratio key in ratio_to_ceiling, the target, whether the value must stay at or below it); the shapes each holds at
STEP, GENERATION, UPDATE = ("step_vs_serial_limit", 1.6, True), ("generate_vs_vllm_with_logprobs", 0.85, False), \
    ("update_vs_forward_backward", 0.7, False)
SYNC_S, START_S = 0.15, 150.0  # seconds, at the 0.6B shape only
SMALL = "qwen3-0.6b"

INTRO = """## One GPU against its targets

Ours on verl at each Qwen3 shape on one GPU (`bash benchmarks/gpu_suite.sh step`, then `step --earlier
$BENCH_RESULTS_DIR/gpu_step.jsonl` for a second launch; `benchmarks/gpu_step.py --shape qwen3-4b --steps 5` at
4B), each phase beside its ceiling measured in the same invocation: the step beside the serial limit (vLLM alone
without log-probs, then plain forward+backward: the least a step that generates and then trains could take),
generation beside vLLM alone with log-probs and, stricter, beside vLLM doing the same work, the update beside
plain forward+backward. Targets (issue 39): step <= 1.6x the serial limit, generation >= 0.85 of vLLM with
log-probs, update >= 0.7 of forward+backward, and at 0.6B the weight sync <= 0.15 s and launch to the end of step 1
<= 150 s. Seconds are medians over steps 2-5, over both launches where two were joined (`launches`). A launch
newer than the last one with ceilings (`--no-ceilings`) has a row of its own above it, its ratios blank. TRL: its
`GRPOTrainer` on the same job on the same machine (`benchmarks/vs_trl.py --shape`), where it ran there.
"""

HEAD = ["shape", "GPU", "launches", "step s", "serial limit s", "step / serial limit (<= 1.6)", "generation s",
        "vs vLLM with log-probs (>= 0.85)", "vs vLLM, same work", "update s", "vs forward+backward (>= 0.7)",
        "weight sync s", "peak GPU used GiB", "launch to step 1 end s", "TRL step s (ours / TRL)", "command",
        "commit", "date"]


def judged(record: dict[str, Any]) -> bool:
    return bool(get(record, "ratio_to_ceiling.step_vs_serial_limit"))


def verdict(value: Any, target: float, at_most: bool) -> str:
    if value is None:
        return ""
    met = value <= target if at_most else value >= target
    return f"{fmt(round(value, 2))} ({'met' if met else 'not met'})"


def rows_of(records: dict[str, list[dict[str, Any]]]) -> list[tuple[str, str | None, dict[str, Any]]]:
    """(shape, GPU model, ours' record) for each shape and GPU model, the newest GPU model first: its newest judged
    record, and above it a newer launch without ceilings (`--no-ceilings`), which shows where the code stands now
    while its ratios stay blank."""
    out = []
    for shape in trl_shapes.SHAPES:
        # newest first; of a launch and its join with the launch before it (the same date), the join first
        ours = sorted((r for r in records.get("gpu_step", []) if trl_shapes.ours_matches(r, shape)),
                      key=lambda r: (str(r.get("date", "")), r.get("launches") or 1), reverse=True)
        for gpu in dict.fromkeys(trl_shapes.gpu_of(r) for r in ours):
            on_it = [r for r in ours if trl_shapes.gpu_of(r) == gpu]
            newest_judged = next((r for r in on_it if judged(r)), None)
            if not judged(on_it[0]):
                out.append((shape, gpu, on_it[0]))
            if newest_judged is not None:
                out.append((shape, gpu, newest_judged))
    return out


def trl_beside(records: dict[str, list[dict[str, Any]]], shape: str, ours: dict[str, Any]) -> str:
    """TRL's newest run of ours' job on ours' machine, and ours / TRL; "-" where it did not run there."""
    trl = trl_shapes.newest([r for r in records.get("vs_trl", []) if trl_shapes.trl_matches(r, shape)
                             and trl_shapes.gpu_of(r) == trl_shapes.gpu_of(ours) and trl_shapes.beside(ours, r)])
    if trl is None:
        return "-"
    if trl["trl"].get("failed"):
        return f"failed ({trl_shapes.failure(trl['trl'])})"
    # TRL's vLLM asleep through its update (vs_trl.py --vllm-sleep, on where its training state and vLLM's budget
    # do not fit the GPU together) costs it a wake-up a step: said, as it is not the same setting as ours
    asleep = ", its vLLM asleep" if (trl.get("trl_settings") or {}).get("vllm_enable_sleep_mode") else ""
    return f"{fmt(trl['trl']['median_s'])} ({ours['step_s'] / trl['trl']['median_s']:.2f}{asleep})"


def with_logprobs(ours: dict[str, Any], ratio: dict[str, Any]) -> float | None:
    """Generation beside vLLM alone with log-probs: its own key where the rollouts asked none, else the same-work
    ratio (rollouts that asked log-probs did vLLM's work with them)."""
    if ratio.get(GENERATION[0]) is not None:
        return ratio[GENERATION[0]]
    return ratio.get("generate_vs_vllm") if get(ours, "phases.generate.sampling_logprobs") is not False else None


def row(records: dict[str, list[dict[str, Any]]], shape: str, gpu: str | None, ours: dict[str, Any]) -> list[str]:
    ratio = ours.get("ratio_to_ceiling") or {}
    small = shape == SMALL
    sync, start = get(ours, "phases.update_weights.s"), get(ours, "startup.launch_to_first_step_s")
    cells = [
        shape, machine_text(ours.get("machine", {})) or str(gpu), fmt(ours.get("launches") or 1),
        fmt(round(ours["step_s"], 2)), fmt(round(ratio["serial_limit_s"], 2)) if ratio.get("serial_limit_s") else "",
        verdict(ratio.get(STEP[0]), *STEP[1:]),
        fmt(round(get(ours, "phases.generate.s"), 2)) if get(ours, "phases.generate.s") else "",
        verdict(with_logprobs(ours, ratio), *GENERATION[1:]),
        fmt(round(ratio["generate_vs_vllm"], 2)) if ratio.get("generate_vs_vllm") else "",
        fmt(round(get(ours, "phases.update.s"), 2)) if get(ours, "phases.update.s") else "",
        verdict(ratio.get(UPDATE[0]), *UPDATE[1:]),
        (verdict(sync, SYNC_S, True) if small else fmt(round(sync, 3))) if sync is not None else "",
        fmt(get(ours, "memory_gb.device_peak_used")),
        (verdict(start, START_S, True) if small else fmt(round(start))) if start is not None else "",
        trl_beside(records, shape, ours), f"`{ours.get('command', '')}`", f"`{ours.get('commit', '')}`",
        str(ours.get("date", ""))[:16].replace("T", " "),
    ]
    return [c.replace("|", "\\|") for c in cells]


def table(records: dict[str, list[dict[str, Any]]]) -> list[str]:
    rows = rows_of(records)
    out = [INTRO, "| " + " | ".join(HEAD) + " |", "|" + "---|" * len(HEAD)]
    out += ["| " + " | ".join(row(records, *r)) + " |" for r in rows]
    if not rows:
        out.append("| " + " | ".join([trl_shapes.MISSING] + [""] * (len(HEAD) - 1)) + " |")
    return out + [""]


if __name__ == "__main__":
    print("\n".join(table(load(Path(sys.argv[1] if len(sys.argv) > 1 else "benchmarks/results")))))
