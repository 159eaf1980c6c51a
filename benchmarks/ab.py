"""One verl job twice in one invocation, as configured (A) and with overrides (B): which phases a setting moves.

    python benchmarks/ab.py actor_cache_at_sync=keep                        # 0.6B shape, 5 steps each, A then B
    python benchmarks/ab.py --b-first actor_cache_at_sync=keep              # B then A (the order's own effect)
    python benchmarks/ab.py --cfg-job actor_cache_at_sync=keep              # compose both commands only (no GPU)
    python benchmarks/ab.py --common actor_rollout_ref.rollout.free_cache_engine=false actor_cache_at_sync=keep
                                                        # both sides with vLLM awake: B adds only actor_cache_at_sync=keep
    bash benchmarks/gpu_suite.sh ab actor_cache_at_sync=keep                # on the lent GPU: both in one call
    python benchmarks/ab.py --a-ceilings --a-earlier outputs/bench/gpu_step.jsonl actor_cache_at_sync=keep
                                                        # A also measures the ceilings, joined with an earlier launch

Each side is `benchmarks/gpu_step.py --shape S --steps K --no-ceilings` (its own line and record too), so both run on
one machine minutes apart, the same job and weights, which a setting's effect needs: one launch's steady steps vary
with the machine by more than some settings move them. Its line: `a` and `b` (step and phase medians over steps
2..K, each step's numbers, peak memory, start-up), `b_over_a` (each phase's B / A median; below 1: B is faster) and
`overrides`. A side that logged no step says why (`error`), and the other is still reported.

`--a-ceilings` runs A as a full `gpu_step.py` launch (its ceilings measured after the job, `--a-earlier` joining its
record with an earlier launch's): the head's second launch for the step targets and the A of a comparison, in one call.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import host_cpu  # noqa: E402

PHASES = ("generate", "old_log_prob", "update", "update_weights")


def side(line: dict[str, Any]) -> dict[str, Any]:
    """What a gpu_step line says of one side: this launch's own medians where the line joins two launches."""
    own = line.get("this_launch") or line
    phases = own.get("phases") or {}
    return {"step_s": own.get("step_s"), **{p: (phases.get(p) or {}).get("s") for p in PHASES},
            "all_step_s": line.get("all_step_s"), "per_step": line.get("per_step"),
            "memory_gb": line.get("memory_gb"), "overrides": line.get("overrides"),
            "launch_to_first_step_s": (line.get("startup") or {}).get("launch_to_first_step_s"),
            # vLLM's engine steps by kind, where the launch logged them (gpu_step.py's docstring; --common gives
            # both sides the engine argument)
            **({"engine_steps": steps} if (steps := (phases.get("generate") or {}).get("engine_steps")) else {}),
            # the cores each process (by name) used in the rollouts: whether a setting moved vLLM's engine core
            **({"host_cpu": cpu} if (cpu := host_cpu.summary(line.get("host_cpu_in_rollout") or {})) else {}),
            **({"ended": line["ended"]} if line.get("ended") else {})}


def compare(a: dict[str, Any], b: dict[str, Any]) -> dict[str, float | None]:
    """Each phase's (and the step's) B / A, where both sides measured it."""
    def ratio(key: str) -> float | None:
        x, y = a.get(key), b.get(key)
        ok = all(isinstance(v, (int, float)) and v == v for v in (x, y))  # NaN: a phase the job never timed
        return round(y / x, 3) if ok and x > 0 else None

    return {key: ratio(key) for key in ("step_s", *PHASES)}


CEILINGS_S = 240  # what a side measuring the ceilings may take beyond its job (three fresh processes; ~80 s on an H200)


def run_side(base: list[str], overrides: list[str], timeout: float) -> dict[str, Any]:
    cmd = [*base, *overrides]
    timeout += 120 + (0 if "--no-ceilings" in base else CEILINGS_S)
    try:  # gpu_step stops its job at `timeout`; the rest is building the model and tearing Ray down
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        return {"error": f"no line after {exc.timeout:.0f} s", "command": cmd}
    lines = [x for x in proc.stdout.splitlines() if x.startswith("{")]
    if proc.returncode != 0 or not lines:
        return {"error": (proc.stderr or proc.stdout)[-2000:], "exit_code": proc.returncode, "command": cmd}
    return {**side(json.loads(lines[-1])), "command": cmd}


def side_commands(args: argparse.Namespace) -> dict[str, list[str]]:
    """Each side's gpu_step.py command before its overrides: B never measures the ceilings, A where asked."""
    base = [sys.executable, str(ROOT / "benchmarks" / "gpu_step.py"), "--shape", args.shape, "--steps", str(args.steps),
            "--timeout", str(args.timeout), "--out", args.out]
    return {"a": [*base, *([] if args.a_ceilings else ["--no-ceilings"]),
                  *(["--earlier", args.a_earlier] if args.a_earlier else [])],
            "b": [*base, "--no-ceilings"]}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="qwen3-0.6b")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--timeout", type=float, default=270, help="seconds per job (gpu_step.py --timeout)")
    ap.add_argument("--out", default=str(ROOT / "outputs" / "gpu_suite"))
    ap.add_argument("--b-first", action="store_true", help="run B before A")
    ap.add_argument("--cfg-job", action="store_true", help="compose both commands (main_grpo.sh --cfg job), no GPU")
    ap.add_argument("--common", action="append", default=[], metavar="KEY=VALUE",
                    help="an override both sides run with (repeatable): B then differs from A only by `overrides`")
    ap.add_argument("--a-ceilings", action="store_true",
                    help="A measures the ceilings too (gpu_step.py without --no-ceilings): a launch of the targets")
    ap.add_argument("--a-earlier", metavar="RESULTS",
                    help="A's record joined with an earlier launch's (gpu_step.py --earlier)")
    ap.add_argument("overrides", nargs="+", help="B's overrides (main_grpo.sh key=value, ours or verl's)")
    args = ap.parse_args(argv)
    bases = side_commands(args)
    if args.cfg_job:
        codes = [subprocess.run([*bases[name], "--cfg-job", *args.common, *o], cwd=ROOT).returncode
                 for name, o in (("a", []), ("b", args.overrides))]
        sys.exit(max(codes))
    order = [("b", args.overrides), ("a", [])] if args.b_first else [("a", []), ("b", args.overrides)]
    sides = {name: run_side(bases[name], [*args.common, *overrides], args.timeout) for name, overrides in order}
    from benchmarks.record import emit

    emit("ab", {"bench": "ab", "shape": args.shape, "steps": args.steps, "overrides": args.overrides,
                "common": args.common,
                "order": [name for name, _ in order], "a": sides["a"], "b": sides["b"],
                "b_over_a": compare(sides["a"], sides["b"])})


if __name__ == "__main__":
    main()
