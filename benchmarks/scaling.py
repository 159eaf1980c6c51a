"""Scaling efficiency of multi-GPU verl steps against a one-GPU step, from benchmarks/gpu_step.py's lines.

    python benchmarks/scaling.py outputs/gpu_suite/results.jsonl      # what gpu_suite.sh two_gpu runs

For every `gpu_step` line with `gpus` > 1 (the latest per shape or model, agent loop, LoRA rank, gpus
and tp), the baseline is the latest one-GPU line of the same shape or model, agent loop and LoRA rank.
One JSON line per such measurement: per phase the seconds and tokens/s of both, and

    efficiency = N-GPU tokens/s / (N x one-GPU tokens/s)

(generation: generated tokens; old log-probs, update and the whole step: all tokens of the step).
The suite's 2-GPU runs take twice the one-GPU prompts (`--batch 32` against 16: the same work per GPU),
so the efficiency reads as throughput per GPU kept; `batch` and `baseline_batch` say which it was.
`target_met`: the whole step's efficiency is at least `--target` (issue 17: 0.8 for a 0.6B model).
A Markdown table of the same numbers goes to stderr, for the README.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.record import emit  # noqa: E402
from rl_factory import jsonl  # noqa: E402

PHASES = ("generate", "old_log_prob", "update", "step")  # with tokens: an efficiency
TIMED_ONLY = ("update_weights", "reward")                  # seconds only


def read_lines(path: Path) -> list[dict]:
    """The `gpu_step` lines of a results file (other benches and unreadable lines are skipped)."""
    out = []
    for text in jsonl.read_lines(path):
        try:
            line = json.loads(text)
        except ValueError:
            continue
        if isinstance(line, dict) and line.get("bench") == "gpu_step":
            out.append(line)
    return out


def _key(line: dict) -> tuple:
    return (line.get("shape") or line.get("model"), line.get("agent_loop"), line.get("lora_rank", 0))


def _phase(line: dict, name: str) -> tuple[float | None, float | None]:
    """(seconds, tokens/s) of a phase; the step's tokens are the trained tokens (old_log_prob's count)."""
    if name == "step":
        seconds, tokens = line.get("step_s"), line.get("phases", {}).get("old_log_prob", {}).get("tokens")
        ok = isinstance(seconds, (int, float)) and isinstance(tokens, (int, float)) and seconds > 0
        return seconds, tokens / seconds if ok else None
    phase = line.get("phases", {}).get(name, {})
    return phase.get("s"), phase.get("tokens_per_s")


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


def efficiency(base: dict, multi: dict, target: float = 0.8) -> dict:
    """One scaling line: `multi` (N GPUs) against `base` (one GPU)."""
    gpus = int(multi["gpus"])
    out = {"bench": "scaling", "shape": multi.get("shape"), "model": multi.get("model"), "gpus": gpus,
           "tp": multi.get("tp", 1), "replicas": gpus // int(multi.get("tp", 1) or 1), "batch": multi.get("batch"),
           "baseline_batch": base.get("batch"), "phases": {}}
    for name in PHASES:
        (s1, t1), (sn, tn) = _phase(base, name), _phase(multi, name)
        eff = tn / (gpus * t1) if _finite(t1) and _finite(tn) and t1 > 0 else None
        out["phases"][name] = {"s_1gpu": s1, "s": sn, "tokens_per_s_1gpu": t1, "tokens_per_s": tn,
                               "efficiency": round(eff, 3) if eff is not None else None}
    for name in TIMED_ONLY:
        out["phases"][name] = {"s_1gpu": _phase(base, name)[0], "s": _phase(multi, name)[0]}
    step = out["phases"]["step"]["efficiency"]
    out["efficiency"] = step
    out["target"] = target
    out["target_met"] = step is not None and step >= target
    out["memory_gb"] = {"1gpu": base.get("memory_gb"), f"{gpus}gpu": multi.get("memory_gb")}
    out["all_step_s"] = {"1gpu": base.get("all_step_s"), f"{gpus}gpu": multi.get("all_step_s")}
    return out


def summarize(lines: list[dict], target: float = 0.8) -> list[dict]:
    """A scaling line per latest multi-GPU measurement; an `error` line where its baseline is missing."""
    latest: dict[tuple, dict] = {}
    for line in lines:  # later lines win: a rerun replaces the earlier measurement
        latest[(*_key(line), int(line.get("gpus", 1)), int(line.get("tp", 1)))] = line
    bases = {k[:3]: v for k, v in latest.items() if k[3] == 1 and k[4] == 1}
    out = []
    for key, line in latest.items():
        if key[3] == 1:
            continue
        base = bases.get(key[:3])
        if base is None:
            out.append({"bench": "scaling", "shape": line.get("shape"), "gpus": key[3], "tp": key[4],
                        "error": "no one-GPU gpu_step line of the same model, agent loop and LoRA rank "
                                 "(bash benchmarks/gpu_suite.sh two_gpu one)"})
            continue
        out.append(efficiency(base, line, target))
    return out


def table(results: list[dict]) -> str:
    """Markdown: phase | 1 GPU s | tokens/s | N GPUs s | tokens/s | efficiency, per measurement."""
    rows = []
    for r in results:
        if "error" in r:
            rows.append(f"{r['gpus']} GPUs, tp {r['tp']}: {r['error']}")
            continue
        rows += [f"\n{r['gpus']} GPUs, tensor parallel {r['tp']} ({r['replicas']} vLLM replica(s)), "
                 f"{r['batch']} prompts/step against {r['baseline_batch']} on one GPU:",
                 "| phase | 1 GPU s | 1 GPU tokens/s | 2 GPUs s | 2 GPUs tokens/s | efficiency |".replace(
                     "2 GPUs", f"{r['gpus']} GPUs"),
                 "|---|---|---|---|---|---|"]
        for name, p in r["phases"].items():
            rows.append(f"| {name} | {_fmt(p.get('s_1gpu'))} | {_fmt(p.get('tokens_per_s_1gpu'), 0)} | {_fmt(p.get('s'))} "
                        f"| {_fmt(p.get('tokens_per_s'), 0)} | {_fmt(p.get('efficiency'), 2)} |")
    return "\n".join(rows)


def _fmt(x, digits: int = 2) -> str:
    return f"{x:,.{digits}f}" if _finite(x) else ""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", type=Path, help="a results.jsonl with gpu_step lines")
    ap.add_argument("--target", type=float, default=0.8, help="the step efficiency to meet")
    args = ap.parse_args(argv)
    if not args.results.exists():
        ap.error(f"{args.results}: no such file")
    results = summarize(read_lines(args.results), args.target)
    for r in results:
        emit("scaling", r)
    if results:
        print(table(results), file=sys.stderr)
    else:
        print(f"scaling: no multi-GPU gpu_step line in {args.results}", file=sys.stderr)
    return 0 if results and all("error" not in r for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
