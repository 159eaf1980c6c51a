"""Which of the rollout's vLLM engine arguments costs generation: vLLM alone as the rollout's server was configured,
then again with each argument back at vLLM's default, one at a time, on the same requests.

    python benchmarks/ceiling_variants.py outputs/gpu_suite            # after a gpu_step.py launch with ceilings
    python benchmarks/ceiling_variants.py outputs/gpu_suite --only logprobs_mode enable_sleep_mode

gpu_step.py keeps the spec of its `vllm_configured` ceiling (`ceiling-vllm_configured.spec.json`: the model, the step's
requests, the engine arguments). Each variant runs benchmarks/ceilings.py in a fresh process on the same GPU, with
that argument dropped (vLLM's default) and the rest as configured, and reports the median of its timed runs beside
the configured one's: a variant faster than `configured` names an argument that costs generation. Prints one JSON
line.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.ceilings import measure_ceiling  # noqa: E402
from benchmarks.record import emit  # noqa: E402

# each an engine argument the rollout sets that vLLM's offline default does not (or differently)
ARGUMENTS = ("logprobs_mode", "enable_sleep_mode", "compilation_config", "kv_cache_memory_bytes", "max_num_seqs",
             "max_num_batched_tokens", "stream_interval", "distributed_executor_backend")


def variants(engine_args: dict, only: list[str] | None = None) -> dict[str, dict]:
    """name -> engine arguments: `configured` as given, then `without_<arg>` for each argument the spec sets."""
    out = {"configured": dict(engine_args)}
    for arg in only or ARGUMENTS:
        if arg in engine_args:
            out[f"without_{arg}"] = {k: v for k, v in engine_args.items() if k != arg}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path, help="the gpu_step.py --out directory holding ceiling-vllm_configured.spec.json")
    ap.add_argument("--only", nargs="*", help="these arguments only (default: every one the spec sets)")
    args = ap.parse_args()
    spec = json.loads((args.out / "ceiling-vllm_configured.spec.json").read_text())
    runs = {}
    for name, engine_args in variants(spec["engine_args"], args.only).items():
        (args.out / name).mkdir(exist_ok=True)  # each variant's spec and result in a directory of its own
        result = measure_ceiling("vllm_configured", {**spec, "engine_args": engine_args, "without_logprobs": False},
                                 args.out / name)
        runs[name] = ({"error": result["error"][-300:]} if "error" in result else
                      {"seconds": result["seconds"], "all_seconds": result["all_seconds"]})
        print(f"ceiling_variants: {name} {json.dumps(runs[name])}", file=sys.stderr, flush=True)  # as each ends
    base = runs["configured"].get("seconds")
    emit("ceiling_variants", {
        "bench": "ceiling_variants", "model": spec["model"], "requests": len(spec["gen_lens"]),
        "engine_args": spec["engine_args"], "runs": runs,
        # below 1: vLLM generated faster with that argument at its default
        "over_configured": {name: round(r["seconds"] / base, 3) for name, r in runs.items()
                            if base and "seconds" in r}})


if __name__ == "__main__":
    main()
