"""The run guard's cost: the default job with the guard off and on, in one invocation.

The same `bash main_grpo.sh` invocation (the default job: builtin tiny model, calculator MCP server, 16 prompts
x 8 rollouts) runs twice, `trainer.guard.enabled=false` then `true`, each in a fresh run directory. From each
run's metrics.jsonl: the mean `timing/step_s` over its steps (validation is outside it), and for the guarded run
the mean `timing/guard_s` (the guard's own time inside the step: evidence, probes, both weight fingerprints,
bundles) and its share of the step, which the issue's target bounds at 2%. The on/off step-time ratio is
printed too; on a shared machine it carries the machine's noise, the share does not. `guard_violations` counts
the checks that fired in the guarded run (a false alarm on this job would be one).

    .venv/bin/python benchmarks/guard.py                     # the default job, 40 steps each
    .venv/bin/python benchmarks/guard.py --steps 10          # a shorter look
    .venv/bin/python benchmarks/guard.py --steps 10 model.path=/path/to/model   # extra overrides pass through
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.record import emit  # noqa: E402
from rl_factory.jsonl import read_records  # noqa: E402

TARGET_SHARE = 0.02


def run_job(out_dir: Path, guard: bool, steps: int, seed: int, extra: list[str]) -> list[dict]:
    args = ["bash", str(ROOT / "main_grpo.sh"), f"trainer.output_dir={out_dir}", f"seed={seed}",
            f"trainer.total_steps={steps}", f"trainer.guard.enabled={str(guard).lower()}", "trainer.progress=false",
            "trainer.report=false", "trainer.save_every=0", "trainer.resume=never", *extra]
    done = subprocess.run(args, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"guard={guard}: main_grpo.sh exited {done.returncode}: {done.stderr[-2000:]}")
    return read_records(out_dir / "metrics.jsonl")


def mean_of(lines: list[dict], key: str) -> float | None:
    values = [m[key] for m in lines if m.get("step", 0) > 0 and isinstance(m.get(key), (int, float))]
    return statistics.fmean(values) if values else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40, help="training steps of each run (the default job: 40)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("overrides", nargs="*", help="more overrides for both runs")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="guard-bench-") as tmp:
        off = run_job(Path(tmp) / "off", False, args.steps, args.seed, args.overrides)
        on = run_job(Path(tmp) / "on", True, args.steps, args.seed, args.overrides)
    off_s, on_s, guard_s = mean_of(off, "timing/step_s"), mean_of(on, "timing/step_s"), mean_of(on, "timing/guard_s")
    emit("guard", {
        "steps": args.steps, "seed": args.seed, "overrides": args.overrides,
        "off_step_s": round(off_s, 4), "on_step_s": round(on_s, 4), "on_vs_off": round(on_s / off_s, 4),
        "guard_s": round(guard_s, 5), "guard_share": round(guard_s / on_s, 5), "target_share": TARGET_SHARE,
        "guard_violations": sum(m.get("guard/violations", 0) for m in on),
    })


if __name__ == "__main__":
    main()
