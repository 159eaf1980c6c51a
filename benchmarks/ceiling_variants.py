"""Which of the rollout's vLLM engine arguments costs generation: vLLM alone as the rollout's server was configured,
then again with each argument back at vLLM's default, one at a time, on the same requests.

    python benchmarks/ceiling_variants.py outputs/gpu_suite            # after a gpu_step.py launch with ceilings
    python benchmarks/ceiling_variants.py outputs/gpu_suite --only logprobs_mode enable_sleep_mode
    python benchmarks/ceiling_variants.py outputs/gpu_suite --only --set \
        'compiled={"compilation_config": {"mode": "VLLM_COMPILE", "cudagraph_mode": "FULL"}}'

gpu_step.py keeps the spec of its `vllm_configured` ceiling (`ceiling-vllm_configured.spec.json`: the model, the step's
requests, the engine arguments). Each variant runs benchmarks/ceilings.py in a fresh process on the same GPU, with
that argument dropped (vLLM's default) and the rest as configured, and reports the median of its timed runs beside
the configured one's: a variant faster than `configured` names an argument that costs generation. `--set NAME=JSON`
adds a variant of its own: those engine arguments over the configured ones (a key inside `compilation_config` replaces
only that key; null drops an argument; `env`, a JSON object, sets environment variables of the variant's process:
`--set 'spawn={"env": {"VLLM_WORKER_MULTIPROC_METHOD": "spawn"}}'` starts vLLM's engine core as verl's server
does, spawned, not forked). `--frontends llm async` runs each variant through vLLM's offline `LLM` and
through `AsyncLLM`, the engine client verl's server runs (`NAME@async`): what the server's frontend costs.
`--busy-cores N` runs each also with N processes spinning on the host (`NAME+busyN`): whether the CPU a job's other
processes use beside its rollout slows vLLM's engine loop. `--pyspy` records vLLM's engine core with py-spy over each
variant's passes without log-probs (with `--without-logprobs`): its loop offline, beside the same loop behind verl's
server (`gpu_suite.sh profile`). Prints one JSON line.
"""
from __future__ import annotations

import argparse
import itertools
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


def variants(engine_args: dict, only: list[str] | None = None, sets: dict[str, dict] | None = None) -> dict[str, dict]:
    """name -> engine arguments: `configured` as given, then `without_<arg>` for each argument the spec sets (each
    of `only`, where given: an empty list runs none), then each of `sets` over the configured arguments."""
    out = {"configured": dict(engine_args)}
    for arg in ARGUMENTS if only is None else only:
        if arg in engine_args:
            out[f"without_{arg}"] = {k: v for k, v in engine_args.items() if k != arg}
    for name, changes in (sets or {}).items():
        args = dict(engine_args)
        for key, value in changes.items():
            if key == "compilation_config" and isinstance(value, dict):  # the capture sizes stay as configured
                value = {**dict(args.get(key) or {}), **value}
            args[key] = value
        out[name] = {k: v for k, v in args.items() if v is not None}
    return out


def parse_set(text: str) -> tuple[str, dict]:
    """`NAME=JSON` (a JSON object of engine arguments) -> (name, arguments); a clear error names the bad part."""
    name, sep, value = text.partition("=")
    try:
        changes = json.loads(value) if sep and name else None
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"--set {text!r}: the part after '=' is not JSON ({e})") from e
    if not isinstance(changes, dict):
        raise argparse.ArgumentTypeError(f"--set {text!r}: expected NAME={{...engine arguments as a JSON object}}")
    return name, changes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path, help="the gpu_step.py --out directory holding ceiling-vllm_configured.spec.json")
    ap.add_argument("--only", nargs="*", help="these arguments only (default: every one the spec sets; none: no "
                    "`without_` variant)")
    ap.add_argument("--set", dest="sets", action="append", type=parse_set, default=[], metavar="NAME=JSON",
                    help="a variant of its own: these engine arguments over the configured ones (repeatable)")
    ap.add_argument("--without-logprobs", action="store_true",
                    help="each variant also runs the requests without log-probs, as rollouts that ask none do")
    ap.add_argument("--pyspy", action="store_true",
                    help="py-spy on vLLM's engine core over each variant's passes without log-probs (NAME/pyspy/)")
    ap.add_argument("--busy-cores", type=int, default=0, metavar="N",
                    help="each variant also runs with N processes spinning on the host beside it (NAME+busyN)")
    ap.add_argument("--frontends", nargs="+", default=["llm"], choices=["llm", "async"],
                    help="vLLM's engine clients each variant runs through: `llm` (offline LLM.generate) and `async` "
                    "(AsyncLLM, as verl's server; its variants are named NAME@async)")
    args = ap.parse_args()
    spec = json.loads((args.out / "ceiling-vllm_configured.spec.json").read_text())
    runs = {}
    engine_variants = variants(spec["engine_args"], args.only, dict(args.sets))
    loads = sorted({0, max(args.busy_cores, 0)})
    for (name, engine_args), frontend, busy in itertools.product(engine_variants.items(), args.frontends, loads):
        name = (name if frontend == "llm" else f"{name}@{frontend}") + (f"+busy{busy}" if busy else "")
        (args.out / name).mkdir(exist_ok=True)  # each variant's spec and result in a directory of its own
        profile = {"pyspy": str(args.out / name / "pyspy")} if args.pyspy else {}
        engine_args = dict(engine_args)
        env = engine_args.pop("env", None) or {}  # a --set variant's environment, not an engine argument
        result = measure_ceiling("vllm_configured", {**spec, "engine_args": engine_args, "frontend": frontend,
                                                     "without_logprobs": args.without_logprobs, "busy_cores": busy,
                                                     **profile, **({"env": env} if env else {})}, args.out / name)
        bare = result.get("without_logprobs") or {}
        runs[name] = ({"error": result["error"][-300:]} if "error" in result else
                      {"seconds": result["seconds"], "all_seconds": result["all_seconds"],
                       **({"without_logprobs_seconds": bare["seconds"]} if bare else {}),
                       **({"pyspy": bare["pyspy"]} if bare.get("pyspy") else {}),
                       **{k: result[k] for k in ("engine_steps", "engine_gc") if result.get(k)}})
        print(f"ceiling_variants: {name} {json.dumps(runs[name])}", file=sys.stderr, flush=True)  # as each ends
    first = next(iter(runs.values()))  # `configured` on the first frontend
    base, bare_base = first.get("seconds"), first.get("without_logprobs_seconds")
    emit("ceiling_variants", {
        "bench": "ceiling_variants", "model": spec["model"], "requests": len(spec["gen_lens"]),
        "engine_args": spec["engine_args"], "runs": runs,
        # below 1: vLLM generated faster with that argument at its default
        "over_configured": {name: round(r["seconds"] / base, 3) for name, r in runs.items()
                            if base and "seconds" in r},
        **({"over_configured_without_logprobs": {name: round(r["without_logprobs_seconds"] / bare_base, 3)
                                                 for name, r in runs.items() if "without_logprobs_seconds" in r}}
           if bare_base else {})})


if __name__ == "__main__":
    main()
