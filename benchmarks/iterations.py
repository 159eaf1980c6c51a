"""vLLM's per-iteration log lines, summed up: how many engine steps a rollout took and of what kind.

    python benchmarks/iterations.py outputs/gpu_suite/run-*/bench_stdout.log outputs/gpu_suite/run-*/ceiling-vllm_configured.log

vLLM logs one line per engine step where its engine arguments ask for it
(`+actor_rollout_ref.rollout.engine_kwargs.vllm.enable_logging_iteration_details=true`; the `vllm_configured`
ceiling takes the rollout's engine arguments, so it logs the same lines into `ceiling-vllm_configured.log`):

    Iteration(412): 3 context requests, 96 context tokens, 125 generation requests, 125 generation tokens, iteration elapsed time: 0.41 ms

A step with context (prompt) tokens and generation tokens together is mixed: under `FULL_DECODE_ONLY` it runs
without CUDA graphs, under `FULL` (the tuning's, rl_factory/backends/verl/vllm_graphs.py) as one graph up to the
largest capture size. The elapsed time is only how long the engine waited for that step's result (with async
scheduling the next step is scheduled while this one runs): near zero where the engine's own Python, not the GPU,
sets the pace.
One JSON line per log: the steps by kind (decode-only, prefill-only, mixed), each kind's median and total wait, the
largest batch, and for a job's log the steps per rollout where the number of rollouts is given (`--rollouts`).

Where vLLM's engine core also logged its garbage collections (`VLLM_GC_DEBUG=1` in its environment: for a job,
`+ray_kwargs.ray_init.runtime_env.env_vars.VLLM_GC_DEBUG=1`; a ceiling inherits the caller's), `gc` sums them by
generation: how many, their seconds in all and the longest, over the whole log, and in a ceiling's log
(`benchmarks/ceilings.py` marks each timed pass) those inside its timed passes by kind of pass (`in_timed_passes`):

    (EngineCore pid=9) INFO ... GC took 0.412ms to complete. Collected 12 objects (out of 731) in GC generation 0.

The Python the engine runs between its GPU steps sets a small model's pace; its collections are part of that Python.
"""
from __future__ import annotations

import argparse
import re
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.record import emit  # noqa: E402

LINE = re.compile(r"Iteration\((\d+)\): (\d+) context requests, (\d+) context tokens, (\d+) generation requests, "
                  r"(\d+) generation tokens, iteration elapsed time: ([\d.]+) ms")


GC_LINE = re.compile(r"\(EngineCore[^)]*pid=(\d+)\).*?GC took ([\d.]+)ms to complete\. Collected (\S+) objects "
                     r"\(out of (\d+)\) in GC generation (\d)")
# what a vLLM ceiling prints to its stdout around each timed pass (benchmarks/ceilings.py), where the engine core
# writes its log too: a collection logged between the two lines fell inside that pass
PASS_MARK = "rl_factory ceiling pass"
PASS_LINE = re.compile(rf"^{PASS_MARK} (begins|ends): (\S+)$", re.M)


def gc_pauses(text: str) -> dict | None:
    """The engine core's logged garbage collections by generation (count, seconds in all, longest ms, median objects
    scanned), or None where it logged none. vLLM attaches its GC logger in the engine core and again in the GPU worker,
    which `uni` runs in the same process: one collection then logs two lines in a row, counted once."""
    found, last, last_end = [], None, 0
    for m in GC_LINE.finditer(text):
        key = (m[1], m[5], m[4], m[3])  # pid, generation, objects scanned, collected
        # the second logger's line follows the first's directly; the same numbers lines apart are another collection
        if key == last and text.count("\n", last_end, m.start()) <= 1:
            last = None
            continue
        last, last_end = key, m.end()
        found.append((int(m[5]), float(m[2]), int(m[4]), m.start()))
    if not found:
        return None
    out: dict = {}
    for generation in sorted({g for g, *_ in found}):
        ms = [t for g, t, *_ in found if g == generation]
        out[f"gen{generation}"] = {"collections": len(ms), "total_s": round(sum(ms) / 1000, 4), "max_ms": max(ms),
                                   "median_objects": statistics.median(n for g, _, n, _ in found if g == generation)}
    out["total_s"] = round(sum(t for _, t, *_ in found) / 1000, 4)
    passes = in_passes(text, [(at, ms) for _, ms, _, at in found])
    if passes:
        out["in_timed_passes"] = passes
    return out


def in_passes(text: str, collections: list[tuple[int, float]]) -> dict:
    """The collections (position in the log, ms) that fell inside a ceiling's timed passes, by kind of pass: a
    pause there slows the ceiling the job is set beside, where one at start-up or in the warm-up does not."""
    spans, opened = [], {}
    for m in PASS_LINE.finditer(text):
        if m[1] == "begins":
            opened[m[2]] = m.end()
        elif m[2] in opened:
            spans.append((opened.pop(m[2]), m.start(), m[2]))
    out: dict = {}
    for start, end, kind_of_pass in spans:
        inside = [ms for at, ms in collections if start <= at < end]
        got = out.setdefault(kind_of_pass, {"passes": 0, "collections": 0, "total_s": 0.0, "max_ms": 0.0})
        got["passes"] += 1
        got["collections"] += len(inside)
        got["total_s"] = round(got["total_s"] + sum(inside) / 1000, 4)
        got["max_ms"] = max([got["max_ms"], *inside])
    return out


def parse(text: str) -> list[dict]:
    return [{"index": int(m[1]), "ctx_reqs": int(m[2]), "ctx_tokens": int(m[3]), "gen_reqs": int(m[4]),
             "gen_tokens": int(m[5]), "wait_ms": float(m[6])} for m in LINE.finditer(text)]


def kind(step: dict) -> str:
    if step["ctx_tokens"] and step["gen_tokens"]:
        return "mixed"
    return "prefill" if step["ctx_tokens"] else "decode"


def summary(steps: list[dict], rollouts: int | None = None) -> dict:
    out: dict = {"steps": len(steps)}
    for name in ("decode", "prefill", "mixed"):
        waits = [s["wait_ms"] for s in steps if kind(s) == name]
        out[name] = {"steps": len(waits), "median_wait_ms": statistics.median(waits) if waits else None,
                     "total_wait_s": round(sum(waits) / 1000, 4)}
    out["max_batch"] = max((s["ctx_reqs"] + s["gen_reqs"] for s in steps), default=0)
    out["context_tokens"] = sum(s["ctx_tokens"] for s in steps)
    if rollouts:
        out["steps_per_rollout"] = len(steps) / rollouts
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("logs", nargs="+", type=Path)
    ap.add_argument("--rollouts", type=int, default=None, help="rollouts in each log (a job's steps), for steps_per_rollout")
    args = ap.parse_args()
    for log in args.logs:
        text = log.read_text(errors="replace")
        gc = gc_pauses(text)
        emit("iterations", {"bench": "iterations", "log": str(log), **summary(parse(text), args.rollouts),
                            **({"gc": gc} if gc else {})})


if __name__ == "__main__":
    main()
