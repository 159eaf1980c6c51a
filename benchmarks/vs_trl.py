"""Our embedded trainer vs. TRL's GRPOTrainer on the same job, in one invocation.

Both train the same prebuilt tiny model (`builtin:tiny-calculator`) on the same data
(examples/calculator), with the same reward (`numeric_exact_match` of the last assistant message),
16 prompts x 8 rollouts, temperature 1, lr 3e-4 with 3 warmup steps, grad clip 1, no KL, token-mean
clipped loss (TRL's `dapo`), at most 3 assistant turns of 64 tokens. Ours is `bash main_grpo.sh`
(its defaults are this job) calling the calculator MCP server; TRL gets the same calculator as a
Python function tool. Afterwards `bash main_eval.sh` scores both final models greedily on the
100 validation rows.

What it takes to give TRL our exact prompt (the tiny model only knows that one): its tool schema is
rendered from our MCP server's schema (TRL builds one from the function's signature and docstring),
and TRL's Qwen3 response template (`qwen3_template`, or `qwen3_schema` on transformers < 5.13)
lets it parse the model's Hermes-style tool calls.

Both run with as many torch threads as the machine has cores, as a user's job does (`OMP_NUM_THREADS`
overrides it for both; the README's earlier tables used 1).

`--tool-latency-ms 200` slows every tool call by that much on both sides (our calculator server's
`--latency-ms`; a `time.sleep` in TRL's function: TRL calls tools one after another).

Prints one JSON line: per framework the mean seconds per training step (every step of ours: its
`timing/step_s` leaves validation out, `val_s` is the validations' total; TRL runs none; TRL's
first step, which builds its caches, is left out), the spread max/median over steps, the mean split of a step into
generation, tools, reward and update, and the greedy validation accuracy of its final model;
plus `ours_vs_trl_step_time` (target <= 0.8) and the load average before and after.

    .venv/bin/python benchmarks/vs_trl.py                       # the default job, 40 steps each
    .venv/bin/python benchmarks/vs_trl.py --tool-latency-ms 200
    .venv/bin/python benchmarks/vs_trl.py --steps 5 --skip-eval  # a quick look
    .venv/bin/python benchmarks/vs_trl.py --only ours --skip-eval --repeats 3  # is the spread the work's or the machine's?

On a GPU, `--device cuda --vllm` gives TRL vLLM for generation (`use_vllm=True`, colocated: vLLM in the
trainer's process, weights copied into it before each step's generation) and bf16 autocast, as TRL's GPU
recipes run it; `--max-response-tokens` and `--lr` set the job for both sides (ours: `model.device=cuda` on the
embedded backend). The verl table's TRL row (README) is

    python benchmarks/vs_trl.py --only trl --device cuda --vllm --steps 8 --skip-eval --max-response-tokens 256 --lr 1e-6

TRL is an optional dependency (`pip install -e '.[bench]'`); without it TRL's side is skipped with
a message and only ours runs.

**At the Qwen3 shapes** (`--shape qwen3-0.6b|qwen3-4b`, GPU): TRL's side only, on the job of
`benchmarks/gpu_step.py --shape` (ours on verl; its parser's defaults are read here, so the two cannot drift):
the same random-init weights (`shapes.build_shape` into `--models`, the directory gpu_step's `--out` names, so
both sides load the one build), 16 prompts x 8, 3 turns of 256 tokens, 512 tokens a trajectory, lr 1e-6 with 3
warmup steps, temperature 1, no KL, the same data, reward and calculator. TRL's vLLM importance-sampling
correction is off (no old-log-prob forward, as ours' default `update` mode); its micro-batches and activation
checkpointing follow ours' tuning plan for the shape (TRL_SHAPE_SETTINGS). Step seconds and each phase are
medians over steps 2..K, as gpu_step.py reports ours; peak memory is the process's torch allocator, the device's
used memory (nvidia-smi, sampled while the job runs: the number that means the same for verl's several processes)
and vLLM's share. `docs/benchmarks.md` puts the newest such record beside ours' newest gpu_step record of the shape.

    python benchmarks/vs_trl.py --shape qwen3-0.6b --device cuda --vllm --steps 5 --models outputs/gpu_suite
    python benchmarks/vs_trl.py --shape qwen3-smoke --steps 2   # CPU: the code path, on a 2-layer shape
"""
from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from benchmarks.record import emit  # noqa: E402
from benchmarks.trl_side import run_trl, step_stats, trl_missing  # noqa: E402
from rl_factory.jsonl import read_records  # noqa: E402
CALCULATOR_MANIFEST = ROOT / "configs" / "tools" / "calculator.yaml"
# The job, as configs/grpo.yaml sets it for ours; TRL gets the same numbers below.
JOB = {"prompts": 16, "n": 8, "temperature": 1.0, "lr": 3e-4, "warmup_steps": 3, "grad_clip": 1.0,
       "max_turns": 3, "max_response_tokens": 64, "max_total_tokens": 512, "seed": 0}
# TRL's micro-batches and activation checkpointing at each shape. Ours' tuning plan on an H200 gives verl's actor
# 32,768 tokens a micro-batch at both shapes (64 sequences of the 512-token trajectories), checkpointing at 4B only
# (tests/benchmarks/test_vs_trl_shape.py checks TRL never gets more). TRL pads every sequence to the micro-batch's
# longest and has no fused log-prob kernel: its logits are materialized (at 4B, 151,936 of them a token, about
# 2.5 GB in bf16 for 16 sequences, several such copies through the loss and its gradient) beside fp32 weights and
# Adam state (64 GB at 4B) and vLLM's 30%. So it gets half ours' micro-batch at 0.6B and a quarter at 4B;
# `--micro-batch` tries others.
TRL_SHAPE_SETTINGS = {"qwen3-0.6b": {"micro_batch": 32, "gradient_checkpointing": False},
                      "qwen3-4b": {"micro_batch": 16, "gradient_checkpointing": True},
                      "qwen3-smoke": {"micro_batch": 64, "gradient_checkpointing": False}}
# TRL's trainer keeps fp32 weights, their gradients and Adam's two moments (16 bytes a parameter) all step long,
# beside colocated vLLM's budget. Where the two pass SLEEP_SHARE of the GPU, `--vllm-sleep auto` turns on TRL's
# `vllm_enable_sleep_mode` (vLLM lets go of its weights and KV cache while TRL trains, as verl's rollout does
# between generations): without it TRL at 4B stopped out of memory at its first optimizer step on an H100 80GB
# (64 GB of training state + 24 GB of vLLM), while it fits without on an H200. Waking vLLM costs TRL time, so it is
# off wherever TRL fits without it.
TRAINING_BYTES_PER_PARAMETER = 16
SLEEP_SHARE = 0.85


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=None, help="training steps (default 40; with --shape gpu_step's 5)")
    parser.add_argument("--seed", type=int, default=0,
                        help="training seed of both runs (the starting model is always the one built from seed 0)")
    parser.add_argument("--tool-latency-ms", type=float, default=0.0)
    parser.add_argument("--out", default=None, help="run directories (default: a temporary directory)")
    parser.add_argument("--skip-eval", action="store_true", help="no main_eval.sh of the final models")
    parser.add_argument("--only", choices=["ours", "trl"], default=None)
    parser.add_argument("--repeats", type=int, default=1,
                        help="run ours this many times with the same seed (ours_repeats: each run's spread, and the "
                             "spread of the work itself, the per-step median of the runs)")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--vllm", action="store_true", help="TRL generates with vLLM, colocated (needs --device cuda)")
    parser.add_argument("--vllm-memory", type=float, default=0.3, help="TRL's vllm_gpu_memory_utilization")
    parser.add_argument("--vllm-sleep", choices=["auto", "on", "off"], default="auto",
                        help="with --shape --vllm: TRL's vllm_enable_sleep_mode (auto: on only where TRL's training "
                             "state and vLLM's budget would not fit the GPU; see SLEEP_SHARE)")
    parser.add_argument("--max-response-tokens", type=int, default=None,
                        help=f"per turn, both sides (default {JOB['max_response_tokens']}; with --shape gpu_step's)")
    parser.add_argument("--lr", type=float, default=None, help=f"both sides (default {JOB['lr']}; with --shape gpu_step's)")
    parser.add_argument("--shape", choices=sorted(TRL_SHAPE_SETTINGS),
                        help="TRL only, on gpu_step.py's job at this random-init Qwen3 shape (see above)")
    parser.add_argument("--models", default=str(ROOT / "outputs" / "gpu_step"),
                        help="with --shape: where the shape's model is built or found (gpu_step.py's --out)")
    parser.add_argument("--micro-batch", type=int, default=None,
                        help="TRL's sequences per forward/backward (default: the whole batch; with --shape "
                             "TRL_SHAPE_SETTINGS)")
    parser.add_argument("--timeout", type=float, default=None,
                        help="seconds before TRL's run is stopped; the steps it finished are still reported")
    parser.add_argument("--dry-run", action="store_true",
                        help="with --shape: print the job and TRL's settings, run nothing (gpu_suite.sh check)")
    args = parser.parse_args()
    if args.vllm and args.device != "cuda":
        parser.error("--vllm needs --device cuda")
    if args.shape:  # ours at a shape is gpu_step.py's verl job; this side is TRL's
        if args.only == "ours" or args.repeats > 1:
            parser.error("--shape runs TRL only (ours at the shape: benchmarks/gpu_step.py --shape)")
        args.only, args.skip_eval = "trl", True  # random-init weights: nothing to evaluate
    defaults = shape_job(args.shape) if args.shape else {"steps": 40, **JOB}
    for name in ("steps", "max_response_tokens", "lr"):
        if getattr(args, name) is None:
            setattr(args, name, defaults[name])
    if args.dry_run:
        if not args.shape:
            parser.error("--dry-run goes with --shape")
        from benchmarks.shapes import shape_config_dir
        print(json.dumps({"bench": "vs_trl_dry_run", "shape": args.shape, "steps": args.steps, "job": job(args),
                          "trl_settings": trl_settings(args, shape_config_dir(args.shape, Path(args.models))),
                          "model": str(Path(args.models) / f"model-{args.shape}")}))
        return
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="vs_trl-"))
    out.mkdir(parents=True, exist_ok=True)
    if args.shape:
        missing = trl_missing()
        if missing:
            sys.exit(f"vs_trl: {missing}; --shape runs TRL only: put trl on the path (see benchmarks/README.md)")
        result = run_shape(args, out)
    else:
        result = run(args, out)
    emit("vs_trl", result)
    if (result.get("trl") or {}).get("failed"):  # recorded, and still a failed run for the caller
        sys.exit(1)


def run(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    load_before = os.getloadavg()
    tools, model_dir = asyncio.run(calculator_model())
    manifest = slow_manifest(out, args.tool_latency_ms)
    result: dict[str, Any] = {"benchmark": "vs_trl", "steps": args.steps, "tool_latency_ms": args.tool_latency_ms,
                              "job": job(args), "model": str(model_dir), "device": args.device,
                              "trl_generation": "vllm (colocate)" if args.vllm else "transformers generate()"}
    # Both sides get the same torch threads: the machine's cores, as a user's job gets them (torch's
    # default), unless OMP_NUM_THREADS says otherwise (=1 is the earlier tables' setting).
    threads = os.environ.get("OMP_NUM_THREADS") or str(os.cpu_count() or 1)
    env = dict(os.environ, OMP_NUM_THREADS=threads, TOKENIZERS_PARALLELISM="false",
               HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    if args.only in (None, "ours"):
        result["ours"] = run_ours(args, out / "ours", manifest, model_dir, env)
        if args.repeats > 1:
            dirs = [out / "ours"]
            for k in range(2, args.repeats + 1):
                dirs.append(out / f"ours_repeat{k}")
                run_ours(args, dirs[-1], manifest, model_dir, env)
            result["ours_repeats"] = repeat_stats([metrics_lines(d) for d in dirs])
    if args.only in (None, "trl"):
        missing = trl_missing()
        if missing:
            print(f"vs_trl: skipping TRL ({missing}); install it with: pip install -e '.[bench]'", file=sys.stderr)
            result["trl"] = {"skipped": missing}
        else:
            result["trl"] = run_trl(args, out / "trl", tools, model_dir, env, job(args))
    if not args.skip_eval:
        for side in ("ours", "trl"):
            if result.get(side, {}).get("final_model"):
                result[side]["val_accuracy"] = evaluate(result[side]["final_model"], out / f"eval_{side}", env)
    ours, trl = result.get("ours", {}), result.get("trl", {})
    if ours.get("s_per_step") and trl.get("s_per_step"):
        result["ours_vs_trl_step_time"] = round(ours["s_per_step"] / trl["s_per_step"], 3)
    result.update({"python": platform.python_version(), "cpu_count": os.cpu_count(), "torch_threads":
                   env["OMP_NUM_THREADS"], "loadavg_1m": [round(load_before[0], 2), round(os.getloadavg()[0], 2)],
                   "date": datetime.datetime.now().isoformat(timespec="seconds"), "out": str(out)})
    return result


def shape_job(shape: str) -> dict[str, Any]:
    """gpu_step.py's job at `shape` (its parser's defaults): what ours trains there, and so TRL here."""
    from benchmarks.gpu_step import parse_args

    ours = parse_args(["--shape", shape])
    return {**JOB, "steps": ours.steps, "prompts": ours.batch, "n": ours.n, "lr": ours.lr, "max_turns": ours.max_turns,
            "max_response_tokens": ours.max_response_tokens, "max_total_tokens": ours.max_total_tokens}


def run_shape(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    """TRL on gpu_step.py's job at args.shape, on the same build of the shape's weights."""
    from benchmarks.shapes import build_shape

    load_before = os.getloadavg()
    tools, _ = asyncio.run(calculator_model())  # the MCP schema TRL's prompt is rendered with
    model = build_shape(args.shape, Path(args.models))
    settings = trl_settings(args, model)
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS") or str(os.cpu_count() or 1),
               TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    result: dict[str, Any] = {"benchmark": "vs_trl", "shape": args.shape, "steps": args.steps,
                              "measured_steps": f"2..{args.steps}", "job": job(args), "model": str(model),
                              "device": args.device, "trl_generation": "vllm (colocate)" if args.vllm else
                              "transformers generate()", "vllm_memory": args.vllm_memory if args.vllm else None,
                              "trl_settings": settings, "trl_version": trl_version()}
    result["trl"] = run_trl(args, out / "trl", tools, model, env, job(args), settings)
    result.update({"python": platform.python_version(), "loadavg_1m": [round(load_before[0], 2),
                   round(os.getloadavg()[0], 2)], "date": datetime.datetime.now().isoformat(timespec="seconds"),
                   "out": str(out)})
    return result


def trl_settings(args: argparse.Namespace, model: Path) -> dict[str, Any]:
    """TRL's settings at args.shape (`model`: a directory with the shape's config.json): TRL_SHAPE_SETTINGS, no
    importance-sampling pass (ours' `update` mode has no old-log-prob forward either), no final model (random-init
    weights: nothing to evaluate), and with vLLM whether it sleeps while TRL trains (`vllm_sleep`)."""
    settings = {**TRL_SHAPE_SETTINGS[args.shape], "vllm_importance_sampling_correction": False, "save": False}
    if args.micro_batch:
        settings["micro_batch"] = args.micro_batch
    if args.vllm:
        settings["vllm_enable_sleep_mode"], settings["vllm_sleep_why"] = vllm_sleep(
            args.vllm_sleep, parameter_count(model), args.vllm_memory, device_total_gb())
    return settings


def vllm_sleep(choice: str, parameters: int, vllm_memory: float, device_gb: float | None) -> tuple[bool, str]:
    """Whether TRL's vLLM sleeps while TRL trains, and why: `choice` on/off as asked; auto on where TRL's training
    state (TRAINING_BYTES_PER_PARAMETER) plus vLLM's budget pass SLEEP_SHARE of the GPU's `device_gb`."""
    if choice != "auto":
        return choice == "on", f"--vllm-sleep {choice}"
    if not device_gb:
        return False, "auto: no GPU memory read (nvidia-smi), so TRL's default"
    need = parameters * TRAINING_BYTES_PER_PARAMETER / 2**30 + vllm_memory * device_gb
    fits = need <= SLEEP_SHARE * device_gb
    return not fits, (f"auto: {parameters / 1e9:.2f}B parameters x {TRAINING_BYTES_PER_PARAMETER} bytes + vLLM's "
                      f"{vllm_memory:g} of {device_gb:.1f} GiB = {need:.1f} GiB, "
                      f"{'within' if fits else 'over'} {SLEEP_SHARE:g} of the GPU")


def parameter_count(model: Path) -> int:
    """The parameters of the model whose config.json is in `model`, counted on the meta device (nothing allocated)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        built = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model))
    return sum(p.numel() for p in built.parameters())


def device_total_gb() -> float | None:
    """The first visible GPU's memory in GiB, from the driver (no CUDA context in this process: TRL's worker wants
    the whole GPU); None without nvidia-smi."""
    from benchmarks.gpu_memory import gpu_index, used_and_total_mib

    read = used_and_total_mib(gpu_index())
    return read[1] / 1024 if read else None


def trl_version() -> str | None:
    try:
        import trl

        return trl.__version__
    except ImportError:
        return None


def job(args: argparse.Namespace) -> dict[str, Any]:
    """JOB (or gpu_step.py's job at --shape) with this invocation's seed and overrides: what both sides train."""
    base = shape_job(args.shape) if args.shape else dict(JOB)
    base.pop("steps", None)
    return {**base, "seed": args.seed, "max_response_tokens": args.max_response_tokens, "lr": args.lr}


async def calculator_model() -> tuple[list[dict], Path]:
    """The calculator's MCP tool schemas, and the tiny model built for them (cached after the first build)."""
    from envs import ToolEnv
    from rl_factory.policy import resolve_model_path

    async with ToolEnv.from_manifest(CALCULATOR_MANIFEST) as env:
        tools = await env.list_tools()
    path = resolve_model_path("builtin:tiny-calculator", tools, seed=JOB["seed"],
                              log=lambda *a: print(*a, file=sys.stderr))
    return tools, Path(path)


def slow_manifest(out: Path, latency_ms: float) -> Path:
    """The calculator manifest, with every call delayed by `latency_ms` (the same server and schema)."""
    import yaml

    manifest = yaml.safe_load(CALCULATOR_MANIFEST.read_text())
    if latency_ms:
        manifest["mcpServers"]["calculator"]["args"] += ["--latency-ms", str(latency_ms)]
    path = out / "tools.yaml"
    path.write_text(yaml.safe_dump(manifest))
    return path


# ---- ours ---------------------------------------------------------------------------------------

def run_ours(args, out: Path, manifest: Path, model_dir: Path, env: dict) -> dict[str, Any]:
    # the built model's directory, not builtin:: `seed` would otherwise also pick another model to build
    cmd = ["bash", str(ROOT / "main_grpo.sh"), f"trainer.output_dir={out}", f"trainer.total_steps={args.steps}",
           f"env.tools={manifest}", "trainer.progress=false", "trainer.resume=never", f"seed={args.seed}",
           f"model.path={model_dir}", f"model.device={args.device}",
           f"rollout.max_response_tokens={args.max_response_tokens}", f"optim.lr={args.lr}"]
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"vs_trl: our run failed:\n{proc.stderr[-3000:]}")
    lines = read_records(out / "metrics.jsonl")
    # every training step; validation (step 0, every trainer.eval_every, the last) is timed apart, in timing/val_s
    steps = [m for m in lines if m["step"] > 0]
    split = {"generate_s": "timing/generate_s", "tools_s": "timing/tools_s", "reward_s": "timing/reward_s",
             "update_s": "timing/update_s", "rollout_s": "timing/rollout_s"}
    result = step_stats([m["timing/step_s"] for m in steps])
    result["split"] = {name: round(statistics.fmean(m.get(key, 0.0) for m in steps), 4) for name, key in split.items()}
    result["split"]["note"] = "tools run while other rollouts generate: generate_s + tools_s may exceed rollout_s"
    result["val_s"] = round(sum(m.get("timing/val_s", 0.0) for m in lines), 2)  # all validations, step 0's too
    result["wall_s"] = round(wall, 1)
    result["train_reward_last5"] = round(statistics.fmean(m["reward/mean"] for m in lines[1:][-5:]), 3)
    checkpoints = sorted((out / "checkpoints").glob("step_*"))
    result["final_model"] = str(checkpoints[-1]) if checkpoints else None
    return result


def metrics_lines(run_dir: Path) -> list[dict]:
    return read_records(run_dir / "metrics.jsonl")


# Metrics that measure time (tool latencies; the engine's batching, which follows timing) rather than results.
TIMED_PREFIXES = ("timing/", "engine/", "tool/latency_s/")


def repeat_stats(runs: list[list[dict]]) -> dict[str, Any]:
    """Same seed, same config, run after run: did they do the same work, and how much of each run's step-time
    spread is the work's own?

    `identical` checks every metric that is not a time (TIMED_PREFIXES) at every step, validation included.
    `work_spread` is max/median over steps of the per-step median over the runs, each run's times divided by
    that run's own median first: a step slow in one run only (the machine, not the work) and a run slow from
    end to end both drop out, while a step that is slow because of its trajectories stays slow in every run.
    """
    def results(lines: list[dict]) -> list[dict]:
        return [{k: v for k, v in m.items() if not k.startswith(TIMED_PREFIXES)} for m in lines]

    first = results(runs[0])
    times = [{m["step"]: m["timing/step_s"] for m in lines if m["step"] > 0} for lines in runs]
    steps = sorted(times[0])
    scaled = [{s: t[s] / statistics.median(t.values()) for s in steps} for t in times]
    profile = [statistics.median(run[s] for run in scaled) for s in steps]
    slowest = [max(t, key=t.get) for t in times]
    return {"runs": len(runs), "identical": all(results(lines) == first for lines in runs[1:]),
            "median_s": [round(statistics.median(t.values()), 3) for t in times],
            "spread": [round(max(t.values()) / statistics.median(t.values()), 2) for t in times],
            "slowest_step": slowest,
            "work_spread": round(max(profile) / statistics.median(profile), 2),
            "work_slowest_step": steps[profile.index(max(profile))]}


def evaluate(model: str, out: Path, env: dict) -> float | None:
    cmd = ["bash", str(ROOT / "main_eval.sh"), f"model.path={model}", f"eval.output_dir={out}"]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        print(f"vs_trl: main_eval.sh failed for {model}:\n{proc.stderr[-2000:]}", file=sys.stderr)
        return None
    return json.loads((out / "results.json").read_text())["metrics"]["accuracy"]


if __name__ == "__main__":
    main()
