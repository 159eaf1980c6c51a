"""Async training (`trainer.max_staleness=k`) against on-policy (k=0): step time, accuracy, per-phase times.

    .venv/bin/python benchmarks/async_training.py                                   # every CPU arm, 3 seeds
    .venv/bin/python benchmarks/async_training.py --steps 6 --batch 4 --seeds 0 1 2 # reduced (a shared machine)
    .venv/bin/python benchmarks/async_training.py --arms h200 --steps 6            # on a GPU machine
    .venv/bin/python benchmarks/async_training.py model.num_threads=1 --steps 6     # key=value overrides first

All arms of one invocation go into one JSON line (`emit("async_training", ...)`):

- `cpu_slow_tools`: the default job (`bash main_grpo.sh`: the tiny model, the calculator, 16 prompts x 8)
  with every tool call `--tool-latency-ms` (200) slower (the calculator server's own `--latency-ms`, given in a
  copy of the manifest), for each k of `--staleness` (0 1 2) and each seed of `--seeds`. Per k: the median of
  the seeds' mean step time (`mean_step_s`: `timing/step_s` of steps 2..S, the throughput; validation is
  outside it; `median_step_s` beside it), `speedup` = k=0's / k's, and the final validation accuracy per seed;
  `accuracy_spread_k0` is k=0's max - min over the seeds.
  Target: k=1 at least 1.3x faster, its mean accuracy within k=0's spread.
- `cpu_fast_tools`: the same job with the tools as they are, for each k of `--fast-staleness` (0 1) and the
  first seed: what async gives when the tools are fast (no target).
- `h200`: verl's colocated async trainer (trainer.max_staleness=1 -> trainer.v1.trainer_mode=colocate_async)
  against k=0 on one GPU, for the qwen3-0.6b shape (random init, builtin tokenizer:
  benchmarks/gpu_step.py) and the tiny model, with the per-phase medians of gpu_step.py. Without a GPU the
  arm records `skipped` and why.

Each run is a real `main_grpo.sh` in its own process and directory (deleted afterwards unless `--keep`). The
seeds vary data order and sampling; every CPU run trains the same model, the default build
(`builtin:tiny-calculator` of seed 0, `--model` for another), so that three seeds do not build three models.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.record import emit  # noqa: E402
from benchmarks.stamp import how_it_ended  # noqa: E402
from rl_factory.jsonl import read_records  # noqa: E402

CALCULATOR_MANIFEST = ROOT / "configs" / "tools" / "calculator.yaml"
ARMS = ("cpu_slow_tools", "cpu_fast_tools", "h200")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arms", nargs="+", choices=ARMS, default=["cpu_slow_tools", "cpu_fast_tools"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=40, help="training steps per run (the default job: 40)")
    parser.add_argument("--batch", type=int, default=16, help="data.train_batch_size (the default job: 16)")
    parser.add_argument("--n", type=int, default=8, help="rollout.n (the default job: 8)")
    parser.add_argument("--val-limit", type=int, default=None, help="data.val_limit (default: all 100 rows)")
    parser.add_argument("--tool-latency-ms", type=float, default=200.0)
    parser.add_argument("--staleness", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--fast-staleness", nargs="+", type=int, default=[0, 1])
    parser.add_argument("--partial", choices=["true", "false"], default="true", help="trainer.partial_rollouts")
    parser.add_argument("--model", default=None, help="model.path of the CPU runs (default: the seed-0 builtin build)")
    parser.add_argument("--h200-models", nargs="+", default=["qwen3-0.6b", "tiny"])
    parser.add_argument("--h200-staleness", nargs="+", type=int, default=[1, 0],
                        help="the h200 arm's launches per model, in this order (the async one first: verl's async "
                             "trainer is the part that can fail)")
    parser.add_argument("--shapes-dir", default=None,
                        help="where the h200 arm builds (or finds) a shape's weights, e.g. outputs/gpu_suite (gpu_step.py "
                             "--prepare's): the same path is the same vLLM compile cache entry (default: the runs' "
                             "temporary directory)")
    parser.add_argument("--h200-earlier", default=None,
                        help="a results file (JSON lines) whose latest async_training line on this GPU holds the launches "
                             "of a model that this invocation does not run (a GPU whose launches do not fit one device "
                             "call: k=1 in one call, k=0 in the next, on the same machine); the joined record names them")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds per run")
    parser.add_argument("--keep", action="store_true", help="keep the run directories")
    parser.add_argument("--out", default=None, help="where the run directories go (default: a temporary directory)")
    parser.add_argument("--dry-run", action="store_true", help="print the parsed arguments as JSON and stop")
    parser.add_argument("overrides", nargs="*", help="more key=value overrides for every run (after `--` where an option "
                                                     "that takes several values comes before them)")
    args = parser.parse_args(argv)
    if args.dry_run:
        print(json.dumps(vars(args)))
        return
    if 0 not in args.staleness:
        parser.error("--staleness must include 0 (the baseline)")
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="async_training-"))
    out.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"benchmark": "async_training", "steps": args.steps, "batch": args.batch, "n": args.n,
                              "seeds": args.seeds, "tool_latency_ms": args.tool_latency_ms,
                              "partial_rollouts": args.partial == "true", "run_dirs": str(out) if args.keep else None}
    if args.model is None and {"cpu_slow_tools", "cpu_fast_tools"} & set(args.arms):
        from benchmarks.shapes import builtin_tokenizer_dir
        args.model = str(builtin_tokenizer_dir())  # the default job's model, built once and cached
    result["model"] = args.model
    if "cpu_slow_tools" in args.arms:
        manifest = calculator_manifest(out, args.tool_latency_ms)
        result["cpu_slow_tools"] = compare(args, out / "slow", manifest, args.staleness, args.seeds)
    if "cpu_fast_tools" in args.arms:
        result["cpu_fast_tools"] = compare(args, out / "fast", CALCULATOR_MANIFEST, args.fast_staleness, args.seeds[:1])
    if "h200" in args.arms:
        result["h200"] = h200(args, out / "h200")
    if not args.keep:
        import shutil
        shutil.rmtree(out, ignore_errors=True)
    emit("async_training", result)


def calculator_manifest(out: Path, latency_ms: float) -> Path:
    """The calculator manifest with every call `latency_ms` slower (the same server and schema)."""
    manifest = yaml.safe_load(CALCULATOR_MANIFEST.read_text())
    manifest["mcpServers"]["calculator"]["args"] += ["--latency-ms", str(latency_ms)]
    out.mkdir(parents=True, exist_ok=True)
    path = out / "calculator_slow.yaml"
    path.write_text(yaml.safe_dump(manifest))
    return path


def compare(args, out: Path, manifest: Path, staleness: list[int], seeds: list[int]) -> dict[str, Any]:
    """Per k: the seeds' runs, their step times and accuracies; speedups against k=0 (`summarize`)."""
    return summarize({k: [run_cpu(args, out / f"k{k}-seed{seed}", manifest, k, seed) for seed in seeds]
                      for k in staleness})


def summarize(runs_by_k: dict[int, list[dict[str, Any]]]) -> dict[str, Any]:
    """Per k: the median over the seeds of each run's mean step time, accuracies, speedups against k=0."""
    arm: dict[str, Any] = {}
    staleness = list(runs_by_k)
    for k, runs in runs_by_k.items():
        step_s = statistics.median(r["mean_step_s"] for r in runs)
        accuracies = [r["val_accuracy"] for r in runs if r["val_accuracy"] is not None]
        arm[f"k{k}"] = {"mean_step_s": round(step_s, 3),
                        "median_step_s": round(statistics.median(r["median_step_s"] for r in runs), 3), "runs": runs,
                        "val_accuracy_mean": round(statistics.mean(accuracies), 4) if accuracies else None}
    base = arm["k0"]
    for k in staleness:
        arm[f"k{k}"]["speedup"] = round(base["mean_step_s"] / arm[f"k{k}"]["mean_step_s"], 3)
    accuracies = [r["val_accuracy"] for r in base["runs"] if r["val_accuracy"] is not None]
    if len(accuracies) > 1:
        arm["accuracy_spread_k0"] = round(max(accuracies) - min(accuracies), 4)
        # rounded as the accuracies are: 0.985 - 0.975 is 0.010000000000000009 in floats
        arm["within_spread"] = {f"k{k}": round(abs(arm[f"k{k}"]["val_accuracy_mean"] - base["val_accuracy_mean"]), 4)
                                <= arm["accuracy_spread_k0"] for k in staleness if k}
    return arm


def run_cpu(args, run_dir: Path, manifest: Path, k: int, seed: int) -> dict[str, Any]:
    overrides = [f"model.path={args.model}", f"env.tools={manifest}", f"trainer.total_steps={args.steps}", f"data.train_batch_size={args.batch}",
                 f"rollout.n={args.n}", f"seed={seed}", f"trainer.max_staleness={k}",
                 f"trainer.partial_rollouts={args.partial}", f"trainer.output_dir={run_dir}", "trainer.eval_every=0",
                 "trainer.save_every=0", "trainer.progress=false", "trainer.resume=never", "trainer.report=false",
                 *([f"data.val_limit={args.val_limit}"] if args.val_limit else []), *args.overrides]
    lines, wall = run_job(overrides, run_dir, args.timeout)
    steps = [m for m in lines if m["step"] >= 1]
    last_val = next((m["val/accuracy"] for m in reversed(lines) if "val/accuracy" in m and m["step"] >= 1), None)
    out = {"seed": seed, **step_times(steps), "wall_s": round(wall, 1),
           "val_accuracy": last_val, "val_accuracy_start": lines[0].get("val/accuracy") if lines else None,
           "phases": phase_medians(steps)}
    if k:
        out["staleness_max"] = max(m.get("async/staleness/max", 0) for m in steps)
        out["staleness_mean"] = round(statistics.mean(m.get("async/staleness/mean", 0) for m in steps), 3)
    return out


def step_times(steps: list[dict]) -> dict[str, float]:
    """Mean and median `timing/step_s` of steps 2.. (all steps if there is only one).

    The mean is the throughput. At k >= 1 step times alternate (a step whose batch was ready, then one that
    waited for it: e.g. 1.17 0.36 1.23 0.44 ... s), and the median of such a series lands in either cluster."""
    steady = [m["timing/step_s"] for m in steps if m["step"] >= 2] or [m["timing/step_s"] for m in steps]
    return {"mean_step_s": round(statistics.mean(steady), 3), "median_step_s": round(statistics.median(steady), 3)}


def phase_medians(steps: list[dict]) -> dict[str, float]:
    keys = {"rollout": "timing/rollout_s", "update": "timing/update_s", "tools": "timing/tools_s",
            "trainer_idle": "timing/trainer_idle_s", "generator_idle": "timing/generator_idle_s"}
    return {name: round(statistics.median(m[key] for m in steps if key in m), 3)
            for name, key in keys.items() if any(key in m for m in steps)}


def run_job(overrides: list[str], run_dir: Path, timeout: float) -> tuple[list[dict], float]:
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    t0 = time.perf_counter()
    proc = subprocess.run(["bash", str(ROOT / "main_grpo.sh"), *overrides], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.exit(f"async_training: the run in {run_dir} failed:\n{proc.stderr[-4000:]}")
    lines = read_records(run_dir / "metrics.jsonl")
    return lines, wall


def h200(args, out: Path) -> dict[str, Any]:
    """verl colocated: k=1 against k=0 per model. Per launch: the mean step time of steps 2.. (the throughput: async
    step times alternate, `step_times`), gpu_step.py's per-phase medians, verl's async metrics, start-up and peak
    memory. A launch that fails is recorded with its log's tail, and the next one still runs."""
    import torch

    if not torch.cuda.is_available():
        return {"skipped": "no CUDA device on this machine"}
    from benchmarks import gpu_step, shapes, startup_variants, step_metrics

    arm: dict[str, Any] = {"gpu": torch.cuda.get_device_name(0)}
    for name in args.h200_models:
        shapes_dir = Path(args.shapes_dir) if args.shapes_dir else out
        model = shapes.builtin_tokenizer_dir() if name == "tiny" else shapes.build_shape(name, shapes_dir)
        runs: dict[str, Any] = {}
        for k in args.h200_staleness:
            run_dir = out / f"{name}-k{k}"
            try:
                lines, wall, peak = gpu_step.run_verl(h200_job(args, k, name), model, run_dir)
            except SystemExit as exc:  # the launch never logged a step: what it printed says why
                runs[f"k{k}"] = {"error": str(exc)[-2000:], "startup": startup_variants.startup_record(run_dir)}
                continue
            record = startup_variants.startup_record(run_dir) or {}
            phases = {key: value for key, value in step_metrics.step_numbers(lines, args.steps).items()
                      if not (isinstance(value, float) and value != value)}  # a phase the job never timed: no NaN
            runs[f"k{k}"] = {**step_times(lines), **phases,
                             "steps_logged": len(lines), "wall_s": round(wall, 1), "peak_gpu_used_gib": peak,
                             "launch_to_first_step_s": record.get("launch_to_first_step_s"),
                             "async": async_medians(lines)}
            ended = how_it_ended(run_dir)
            if ended["exit_code"] != 0:  # stopped early (the guard, a crash, --timeout): why, with its steps
                runs[f"k{k}"]["ended"] = ended
        if args.h200_earlier:
            join_earlier(runs, name, arm["gpu"], Path(args.h200_earlier))
        arm[name.replace(".", "_")] = runs  # qwen3-0_6b: record paths are dotted (docsgen)
        if all("mean_step_s" in runs.get(f"k{k}", {}) for k in (0, 1)):
            runs["speedup"] = round(runs["k0"]["mean_step_s"] / runs["k1"]["mean_step_s"], 3)
    return arm


def join_earlier(runs: dict[str, Any], name: str, gpu: str, results: Path) -> None:
    """The launches of `name` this invocation did not run, from the latest async_training line in `results` made on
    the same GPU model; each marked `earlier_invocation` with that line's date, commit and command."""
    key = name.replace(".", "_")
    lines = read_records(results)
    for line in reversed(lines):
        arm = line.get("h200") or {}
        if line.get("benchmark") != "async_training" or arm.get("gpu") != gpu or key not in arm:
            continue
        earlier = {field: line.get(field) for field in ("date", "commit", "command")}
        for launch, record in arm[key].items():
            if launch.startswith("k") and launch not in runs:
                runs[launch] = {**record, "earlier_invocation": earlier}
        return


def async_medians(lines: list[dict]) -> dict[str, float]:
    """Medians over steps 2.. of the async metrics verl's trainer and our plugin log (staleness, version spans,
    idle seconds): empty at k=0, where verl's sync trainer logs none."""
    steady = [m for m in lines if m["step"] >= 2] or lines
    keys = sorted({key for m in steady for key in m if key.startswith(("async/", "training/off_policy/"))
                   or key in ("timing/generator_idle_s", "timing/trainer_idle_s")})
    return {key: round(statistics.median(m[key] for m in steady if isinstance(m.get(key), (int, float))), 4)
            for key in keys if any(isinstance(m.get(key), (int, float)) for m in steady)}


def h200_job(args, k: int, name: str) -> argparse.Namespace:
    """gpu_step.py's job (one GPU, the calculator task, 256 tokens a turn) at staleness k (verl colocated), on the
    builtin tiny model or a random-init shape (`name`)."""
    return argparse.Namespace(shape=None if name == "tiny" else name, gpus=1, tp=1, steps=args.steps,
                              batch=args.batch, n=args.n, max_response_tokens=256, max_total_tokens=1024, max_turns=3, lora_rank=0, lr=1e-6, agent_loop="rl_factory",
                              overrides=[*args.overrides, f"trainer.max_staleness={k}"], timeout=args.timeout)


if __name__ == "__main__":
    main()
