"""One verl training step on a GPU, phase by phase, beside what the hardware does on the same work.

    python benchmarks/gpu_step.py --shape qwen3-0.6b --steps 5            # random init, builtin tokenizer
    python benchmarks/gpu_step.py --model /path/to/hf_model --steps 5
    python benchmarks/gpu_step.py --model <tiny model dir> --agent-loop verl_tool_agent   # verl's own loop
    python benchmarks/gpu_step.py --shape qwen3-0.6b --gpus 2 --tp 1 --batch 32 --no-ceilings   # 2 GPUs
    python benchmarks/gpu_step.py --shape qwen3-0.6b --gpus 2 --cfg-job    # compose only (no GPU needed)

It runs `bash main_grpo.sh trainer.backend=verl` for `--steps` steps of the calculator tool task (16
prompts x 8 rollouts, `--max-response-tokens` per turn, no validation, no checkpoint), reads the run's
metrics.jsonl, then measures three ceilings in the same invocation, each in a fresh process on the same
GPU, on the same model and the same token counts:

- `vllm_generate`: vLLM alone (offline `LLM.generate`) on as many requests as a step had trajectories, all
  at once, each prompt repeated `n` times as in a GRPO group, prompts of the step's mean prompt length, each
  request generating as many tokens as one trajectory of the step did (ignore_eos: the longest sets the
  critical path, as in the rollout), at the rollout's gpu_memory_utilization, returning each sampled token's
  log-prob and no text, as the rollout does (`without_logprobs`: the same without log-probs;
  `with_detokenize`: with vLLM's default incremental detokenization); each the median of five runs, the best
  beside it (`best_seconds`);
- `vllm_configured`: the same requests on vLLM with the engine arguments the rollout's server had (verl's rollout
  config and our tuning's `engine_kwargs`, benchmarks/ceilings.py), with log-probs and without; the phases' vLLM
  ceiling is the faster of the two (`ratio_to_ceiling.vllm_ceiling` names it), as is the serial limit's;
- `forward_backward` and `forward`: plain PyTorch on the model in bf16 (the attention verl's actor uses:
  flash-attn's varlen kernel, or torch's where flash-attn is missing), the step's sequences packed into
  micro-batches of the actor's token budget, logits -> cross-entropy -> backward (no optimizer).

Prints one JSON line: where the launch's time went before its first step (`startup`: the run's startup.json,
rl_factory/backends/verl/startup.py; also printed when the job ends before its first step), per phase the
median seconds over steps 2..K (step 1 compiles and captures graphs;
`--measure-until M`: steps 2..M, the later ones run under py-spy in `gpu_suite.sh step`),
tokens/s, the ceiling and the ratio to it; peak GPU memory as verl reports it; the GPU's SM clock, power,
temperature and throttle reasons and the host's load over the job and in each measured step (`device_clocks`,
from nvidia-smi every 0.5 s; the samples in the run's device_timeline.jsonl); the cores each of the job's processes
and their busiest threads used in each measured step's rollout (`host_cpu_in_rollout`, benchmarks/host_cpu.py; the
samples in host_cpu.jsonl); `startup`, `device_clocks.per_step` and `host_cpu_in_rollout` hold `{"error": ...}`
where they fail, and the numbers stay; the tuned settings used; where the job asks vLLM to log its iterations
(`+actor_rollout_ref.rollout.engine_kwargs.vllm.enable_logging_iteration_details=true`), vLLM's engine steps
by kind per rollout (`phases.generate.engine_steps`) and per run of the configured ceiling
(`ceilings.vllm_configured.engine_steps`; benchmarks/iterations.py).
`--gpus N` trains on N GPUs of this node (FSDP over N ranks) with N / `--tp` vLLM replicas; `--batch` is
the step's prompts over all GPUs (benchmarks/scaling.py compares such lines with a one-GPU one).
`--startup-variant NAME` launches the job with one start-up variant's verl keys (benchmarks/startup_variants.py;
`--fresh-caches`: with empty compile caches, as a first launch on a machine). The ceilings run in
benchmarks/ceilings.py. `--cfg-job` only composes the command it would launch (`main_grpo.sh ... --cfg job`, a shape as a
config-only directory) and prints the tuned settings: the CPU check of a GPU command.
`--shape`: qwen3-0.6b / qwen3-4b are Qwen3's layer shapes with the builtin tokenizer's small vocabulary
(so qwen3-0.6b has 0.44B parameters, as in the baseline the README compares against; qwen3-4b keeps
Qwen3's 151,936-row embedding: 4.0B parameters).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks import host_cpu, iterations, startup_variants  # noqa: E402
from benchmarks.ceilings import configured_engine_args, measure_ceiling, ratios  # noqa: E402
from benchmarks.step_metrics import measured, step_ends, step_numbers  # noqa: E402
from benchmarks.gpu_memory import run_per_step  # noqa: E402
from benchmarks.job_config import old_log_probs_mode, sampling_logprobs, select  # noqa: E402
from benchmarks.record import diagnostic, emit  # noqa: E402
from benchmarks.shapes import SHAPES, build_shape, builtin_tokenizer_dir, shape_config_dir  # noqa: E402
from benchmarks.stamp import ENDED_FILE, how_it_ended, stamp_lines  # noqa: E402
from rl_factory.jsonl import read_records  # noqa: E402

# The same job before tuning (2026-12-01, one H200): 0.44B qwen3-0.6b shape, 16 x 8, 256 tokens a turn.
BASELINE_STEP_S = {"qwen3-0.6b": 23.0}


# Random-init weights never earn a reward: the run guard's reward_constant check (stop after 5 steps of one reward)
# would end every shape's job at step 5. It still runs and logs its streak.
RANDOM_INIT_OVERRIDES = ["trainer.guard.reward_constant.action=warn"]


def verl_overrides(args: argparse.Namespace, model: Path, run_dir: Path) -> list[str]:
    out = [f"model.path={model}", "trainer.backend=verl", f"trainer.n_gpus_per_node={args.gpus}",
           f"actor_rollout_ref.rollout.tensor_model_parallel_size={args.tp}", f"trainer.total_steps={args.steps}",
           f"trainer.output_dir={run_dir}", f"data.train_batch_size={args.batch}", f"rollout.n={args.n}",
           f"rollout.max_response_tokens={args.max_response_tokens}", f"rollout.max_total_tokens={args.max_total_tokens}",
           f"env.max_turns={args.max_turns}", "trainer.resume=never", "trainer.val_before_train=false",
           "trainer.test_freq=-1", "trainer.save_freq=-1", "trainer.logger=[console,jsonl]",
           f"model.lora_rank={args.lora_rank}", f"optim.lr={args.lr}",
           # Ray workers get this PYTHONPATH instead of the driver's: keep the driver's entries after ours
           f"+ray_kwargs.ray_init.runtime_env.env_vars.PYTHONPATH={ROOT}:{os.environ.get('PYTHONPATH', '')}",
           # vLLM says what its start took (weights, compile, graphs, engine: startup_variants.VLLM_TIMES) in INFO
           # lines, which verl's default level for its workers (WARN) hides
           "+ray_kwargs.ray_init.runtime_env.env_vars.VLLM_LOGGING_LEVEL=INFO"]
    if getattr(args, "shape", None):
        out += RANDOM_INIT_OVERRIDES
    if args.agent_loop == "verl_tool_agent":
        from benchmarks.verl_tool_agent import overrides

        out += overrides(args.max_turns)
    if getattr(args, "fresh_caches", False):  # the workers' too, where Ray's do not inherit the driver's environment
        out += [f"+ray_kwargs.ray_init.runtime_env.env_vars.{k}={v}"
                for k, v in startup_variants.fresh_cache_env(run_dir).items()]
    return out + startup_variants.overrides(getattr(args, "startup_variant", "baseline")) + list(args.overrides)


def launch_env(args: argparse.Namespace, run_dir: Path) -> dict[str, str]:
    """The job's environment: our checkout first on PYTHONPATH, the job's mark (every process it starts inherits
    it: gpu_memory.job_processes); with --fresh-caches, compile caches of its own."""
    from benchmarks.gpu_memory import JOB_MARK_VAR

    env = dict(os.environ, PYTHONPATH=f"{ROOT}:{os.environ.get('PYTHONPATH', '')}", **{JOB_MARK_VAR: str(run_dir)})
    return {**env, **startup_variants.fresh_cache_env(run_dir)} if getattr(args, "fresh_caches", False) else env


def run_verl(args: argparse.Namespace, model: Path, run_dir: Path) -> tuple[list[dict], float, dict | None]:
    """Run the job (its output streamed to run_dir/bench_stdout.log); stop it after --timeout seconds.

    Also returns the device's peak used memory while it ran (benchmarks/gpu_memory.py: every process of the job,
    vLLM's server included), None without nvidia-smi.
    """
    import signal

    from benchmarks.gpu_memory import DEVICE_TIMELINE, JOB_MARK_VAR, DevicePeak
    from benchmarks.host_cpu import HOST_CPU_TIMELINE, JobCpu

    env = launch_env(args, run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    log = run_dir / "bench_stdout.log"
    t0 = time.perf_counter()
    with DevicePeak() as device, JobCpu(env[JOB_MARK_VAR]) as cpu:
        proc = subprocess.Popen(["bash", str(ROOT / "main_grpo.sh"), *verl_overrides(args, model, run_dir)], cwd=ROOT,
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
        # Each line stamped with the seconds since launch: where verl's start-up goes (Ray, FSDP, vLLM) is read here.
        writer = threading.Thread(target=stamp_lines, args=(proc.stdout, log, t0), daemon=True)
        writer.start()
        try:
            code = proc.wait(timeout=args.timeout)
        except subprocess.TimeoutExpired:  # keep what finished: the steps logged so far are still measured
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            code = "timeout"
            # Ray's and vLLM's processes outside the job's process group must not hold the GPU for the next launch:
            # they carry the job's mark in their environment (launch_env)
            from benchmarks.gpu_memory import LEFTOVER_WAIT_S, gpu_processes, job_processes, wait_gone

            for pid in job_processes(env[JOB_MARK_VAR]):
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            wait_gone(gpu_processes, LEFTOVER_WAIT_S)
    writer.join(timeout=10)
    device.write_timeline(run_dir / DEVICE_TIMELINE)
    cpu.write_timeline(run_dir / HOST_CPU_TIMELINE)
    wall = time.perf_counter() - t0
    (run_dir / ENDED_FILE).write_text(json.dumps({"exit_code": code}) + "\n")
    metrics = run_dir / "metrics.jsonl"
    lines = read_records(metrics)
    if code != 0:
        print(f"gpu_step: the verl run ended with {code} after {wall:.0f} s; log: {log}", file=sys.stderr)
        if not [m for m in lines if m["step"] >= 1]:  # still one line: where its start-up was when it ended
            print(json.dumps({"bench": "gpu_step", "exit_code": code, "job_wall_s": round(wall, 1),
                              "startup_variant": getattr(args, "startup_variant", "baseline"),
                              "startup": startup_variants.startup_record(run_dir), "log": str(log)}))
            sys.exit(log.read_text()[-4000:])
    return [m for m in lines if m["step"] >= 1], wall, device.result()


def rollout_lengths(run_dir: Path, steps: list[int]) -> dict:
    """Per-trajectory prompt / generated / total tokens of the measured steps (our rollouts files)."""
    prompts, generated, totals, turns = [], [], [], []
    for step in steps:
        path = run_dir / "rollouts" / f"step_{step:06d}.jsonl"
        if not path.exists():
            continue
        for r in read_records(path):  # model text: split on "\n" only (rl_factory/jsonl.py)
            prompts.append(r["prompt_tokens"]), generated.append(r["generated_tokens"])
            totals.append(r["total_tokens"]), turns.append(r["num_turns"])
    return {"prompt": prompts, "generated": generated, "total": totals, "turns": turns}


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    which = ap.add_mutually_exclusive_group()
    which.add_argument("--model", help="a Hugging Face model directory")
    which.add_argument("--shape", choices=sorted(SHAPES), help="a random-init Qwen3 shape with the builtin tokenizer")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--gpus", type=int, default=1, help="GPUs of this node (trainer.n_gpus_per_node)")
    ap.add_argument("--tp", type=int, default=1, help="vLLM tensor parallel size: --gpus / --tp replicas")
    ap.add_argument("--batch", type=int, default=16, help="prompts per step, over all GPUs")
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--max-response-tokens", type=int, default=256)
    ap.add_argument("--max-total-tokens", type=int, default=512)
    ap.add_argument("--max-turns", type=int, default=3)
    ap.add_argument("--lora-rank", type=int, default=0)
    ap.add_argument("--lr", type=float, default=1e-6)
    ap.add_argument("--agent-loop", choices=["rl_factory", "verl_tool_agent"], default="rl_factory")
    ap.add_argument("--no-ceilings", action="store_true")
    ap.add_argument("--measure-until", type=int, default=0,
                    help="medians over steps 2..this (default: --steps); later steps are for a profiler to watch")
    ap.add_argument("--cfg-job", action="store_true", help="compose the command only (main_grpo.sh --cfg job)")
    ap.add_argument("--prepare", action="store_true",
                    help="only build the model (the shape or the builtin one) and exit: the jobs after it start warm")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds before the verl job is stopped")
    ap.add_argument("--startup-variant", default="baseline", choices=sorted(startup_variants.VARIANTS),
                    help="the job with one start-up variant's verl keys (benchmarks/startup_variants.py)")
    ap.add_argument("--fresh-caches", action="store_true",
                    help="empty vLLM / Inductor / Triton compile caches for this launch: a first launch's start-up")
    ap.add_argument("--out", default=str(ROOT / "outputs" / "gpu_step"))
    ap.add_argument("--earlier", default=None, metavar="RESULTS",
                    help="a gpu_step.jsonl: report medians over this launch and its newest record of the same job on "
                         "this GPU model (benchmarks/launches.py)")
    ap.add_argument("overrides", nargs="*", help="more main_grpo.sh overrides (ours or raw verl keys)")
    return ap


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = build_parser()
    args = ap.parse_args(argv)
    if args.gpus < 1 or args.tp < 1 or args.gpus % args.tp:
        ap.error(f"--gpus {args.gpus} must be a multiple of --tp {args.tp} (each vLLM replica spans --tp GPUs)")
    if args.gpus > 1:  # the ceilings are one-GPU measurements; benchmarks/scaling.py compares with a one-GPU run
        args.no_ceilings = True
    return args


TUNED_KEYS = ("actor_rollout_ref.model.override_config.attn_implementation",
              "actor_rollout_ref.model.enable_gradient_checkpointing", "actor_rollout_ref.model.use_fused_kernels",
              "actor_rollout_ref.actor.ppo_max_token_len_per_gpu", "actor_rollout_ref.rollout.gpu_memory_utilization",
              "actor_rollout_ref.rollout.cudagraph_capture_sizes", "actor_rollout_ref.model.fused_kernel_options.impl_backend",
              "algorithm.rollout_correction.bypass_mode", "ray_kwargs.ray_init.runtime_env.env_vars.RL_FACTORY_OLD_LOG_PROBS",
              "actor_rollout_ref.rollout.free_cache_engine", "actor_cache_at_sync",
              "actor_rollout_ref.rollout.engine_kwargs.vllm.distributed_executor_backend",
              "actor_rollout_ref.rollout.engine_kwargs.vllm.compilation_config", "sampling_logprobs_every",
              "actor_rollout_ref.actor.optim.override_optimizer_config")


def cfg_job(args: argparse.Namespace, out: Path) -> dict:
    """The command this invocation would launch, composed by `main_grpo.sh ... --cfg job` (no GPU, no Ray)."""
    import yaml

    model = shape_config_dir(args.shape, out) if args.shape else Path(args.model) if args.model else None
    if model is None:  # the builtin model: --cfg job composes it without building it
        model = "builtin:tiny-calculator"
    overrides = verl_overrides(args, model, out / "run-cfg-job")
    proc = subprocess.run(["bash", str(ROOT / "main_grpo.sh"), *overrides, "--cfg", "job"], cwd=ROOT,
                          capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=f"{ROOT}:{os.environ.get('PYTHONPATH', '')}"))
    result = {"bench": "gpu_step_cfg_job", "shape": args.shape, "gpus": args.gpus, "tp": args.tp, "batch": args.batch,
              "startup_variant": args.startup_variant, "exit_code": proc.returncode,
              "command": ["bash", "main_grpo.sh", *overrides]}
    if proc.returncode != 0:
        return {**result, "error": proc.stderr[-1500:]}
    cfg = yaml.safe_load(proc.stdout)
    return {**result, "replicas": args.gpus // select(cfg, "actor_rollout_ref.rollout.tensor_model_parallel_size"),
            "tuned": {k: select(cfg, k) for k in TUNED_KEYS}}


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.cfg_job:
        result = cfg_job(args, out)
        print(json.dumps(result))
        sys.exit(0 if result["exit_code"] == 0 else 1)
    model = build_shape(args.shape, out) if args.shape else Path(args.model) if args.model else builtin_tokenizer_dir()
    if args.prepare:
        print(json.dumps({"bench": "gpu_step_prepare", "model": str(model)}))
        return
    tag = f"{args.shape or model.name}-{args.agent_loop}" + (f"-lora{args.lora_rank}" if args.lora_rank else "")
    tag += f"-{args.gpus}gpu-tp{args.tp}" if args.gpus > 1 or args.tp > 1 else ""
    run_dir = out / f"run-{tag}-{time.strftime('%H%M%S')}"
    launched = time.time()
    cache = "fresh" if args.fresh_caches else startup_variants.compile_cache(launch_env(args, run_dir))
    lines, wall, device = run_verl(args, model, run_dir)
    kept = startup_variants.keep_fresh_caches(run_dir) if args.fresh_caches else []
    until = args.measure_until or args.steps
    numbers = step_numbers(lines, until)
    steps = sorted({m["step"] for m in measured(lines, until)})
    config = (run_dir / "config.yaml").read_text()
    import yaml

    cfg = yaml.safe_load(config)
    lengths = rollout_lengths(run_dir, steps)
    trajectories = len(lengths["total"]) / max(1, len(steps))
    # verl's own loop writes no rollouts files of ours: its generated tokens are unknown (None), not zero
    gen_tokens = sum(lengths["generated"]) / max(1, len(steps)) if lengths["generated"] else None
    result = {
        "bench": "gpu_step", "model": str(model), "shape": args.shape, "agent_loop": args.agent_loop,
        "lora_rank": args.lora_rank, "gpus": args.gpus, "tp": args.tp, "batch": args.batch, "n": args.n,
        "steps": args.steps, "measured_steps": steps, "trajectories_per_step": trajectories,
        # the job beyond batch x n, and the overrides on top of it: what a comparison (docs/benchmarks.md's TRL
        # table) checks before it puts another framework's step beside this one
        "job": {"max_response_tokens": args.max_response_tokens, "max_total_tokens": args.max_total_tokens,
                "max_turns": args.max_turns, "lr": args.lr}, "overrides": list(args.overrides),
        "mean_turns": statistics.fmean(lengths["turns"]) if lengths["turns"] else None,
        "job_wall_s": round(wall, 1), "step_s": numbers["step"], "all_step_s": numbers["all_step_s"],
        **({"fresh_caches_kept": kept} if kept else {}),
        "per_step": numbers["per_step"],
        # wall-clock ends of the steps: jobs on one GPU (gpu_suite.sh compare) show from these whether their
        # measured steps overlapped
        "launched_unix": round(launched, 1), "step_end_unix": step_ends(run_dir / "bench_stdout.log", launched),
        "phases": {
            # slowest_trajectory_s: the longest agent loop of the step; the phase's time beyond it is verl's.
            # trajectory_starts_s: how long after the first trajectory the last began (a ceiling that submits every
            # request at once pays none of it); trajectories_span_s: the first start to the last return
            # whether every measured step's rollouts asked vLLM for log-probs (sampling_logprobs_every): the ceilings
            # that did the same work set generation's ratio (a mix is set beside the faster, without them)
            "generate": {"s": numbers["generate"], "generated_tokens": gen_tokens,
                         "sampling_logprobs": sampling_logprobs(cfg, args.agent_loop, steps),
                         "tokens_per_s": gen_tokens / numbers["generate"] if gen_tokens else None,
                         "slowest_trajectory_s": numbers["slowest_trajectory"],
                         "trajectory_starts_s": numbers["trajectory_starts"],
                         "trajectories_span_s": numbers["trajectories_span"],
                         # request_starts_s: the same for the first requests' departures to the server;
                         # before_first_request_s: the longest an agent loop took to send its first request
                         "request_starts_s": numbers["request_starts"],
                         "before_first_request_s": numbers["before_first_request"],
                         # the most of trajectory_starts_s inside one agent-loop worker (the rest: verl's dispatch)
                         "trajectory_starts_in_worker_s": numbers["trajectory_starts_in_worker"]},
            # algorithm.old_log_probs (rl_factory/backends/verl/old_log_probs.py): in `update` and `rollout` mode verl
            # runs no forward here, only copies vLLM's log-probs: its time is not a forward's, and has no ceiling
            "old_log_prob": {"s": numbers["old_log_prob"], "tokens": numbers["total_tokens"],
                             "mode": old_log_probs_mode(cfg),
                             "tokens_per_s": numbers["total_tokens"] / numbers["old_log_prob"]},
            "update": {"s": numbers["update"], "tokens": numbers["total_tokens"],
                       "tokens_per_s": numbers["total_tokens"] / numbers["update"]},
            "update_weights": {"s": numbers["update_weights"]}, "reward": {"s": numbers["reward"]},
        },
        # max_*: the FSDP actor's torch allocator (verl's metric); device_*: nvidia-smi over the whole job (vLLM too)
        "memory_gb": {"max_allocated": numbers["max_memory_allocated_gb"], "max_reserved": numbers["max_memory_reserved_gb"],
                      "device_peak_used": (device or {}).get("peak_used_gb"), "device_total": (device or {}).get("total_gb")},
        # the GPU's clocks, power and throttle reasons (and the host's load) over the job and in each measured step:
        # a step slow in every phase at once beside a held-back clock is the GPU's, beside full clocks the host's
        "device_clocks": {"job": (device or {}).get("clocks"),
                          "per_step": diagnostic("device_clocks", run_per_step, run_dir, steps, launched)},
        # the cores each of the job's processes (and threads) used in each measured step's rollout: whether vLLM's
        # engine core kept its core (benchmarks/host_cpu.py)
        "host_cpu_in_rollout": diagnostic("host_cpu_in_rollout", host_cpu.run_rollouts, run_dir, steps),
        "tuned": {k: select(cfg, k) for k in TUNED_KEYS},
        # where the launch's time went before its first step (the run's startup.json, written by our launcher and
        # TaskRunner), under which variant, with vLLM's compile cache as the launch found it
        "startup_variant": args.startup_variant, "compile_cache": cache,
        "startup": diagnostic("startup", startup_variants.startup_record, run_dir),
    }
    ended = how_it_ended(run_dir)
    # vLLM's own count of its engine steps and their kinds, where the job asked it to log them
    # (enable_logging_iteration_details: benchmarks/iterations.py), over the job's rollouts
    log = run_dir / "bench_stdout.log"
    text = log.read_text(errors="replace") if lines and log.exists() else ""
    engine = iterations.parse(text)
    if engine:
        result["phases"]["generate"]["engine_steps"] = iterations.summary(engine, rollouts=len(lines))
    collections = iterations.gc_pauses(text)  # the engine core's garbage collections, where VLLM_GC_DEBUG=1
    if collections:
        result["phases"]["generate"]["engine_gc"] = collections
    if ended["exit_code"] != 0:  # the steps measured are those before it stopped: say why it did
        result["ended"] = ended
    # the baseline is one job (16 x 8, 256 tokens a turn, one GPU): any other batch is other work, not a speedup
    if (args.shape in BASELINE_STEP_S and args.max_response_tokens == 256 and not args.lora_rank and args.gpus == 1
            and (args.batch, args.n) == (16, 8)):
        result["baseline_step_s"] = BASELINE_STEP_S[args.shape]
        result["speedup_vs_baseline"] = BASELINE_STEP_S[args.shape] / numbers["step"]
    if not args.no_ceilings and lengths["total"]:
        requests = {
            "model": str(model), "gpu_memory_utilization": result["tuned"]["actor_rollout_ref.rollout.gpu_memory_utilization"],
            "n": args.n, "prompt_len": round(statistics.fmean(lengths["prompt"])),
            "gen_lens": [max(1, n) for n in lengths["generated"][: round(trajectories)]], "vocab": _vocab(model)}
        vllm = measure_ceiling("vllm", requests, out)
        # the same requests on vLLM as the rollout's server was configured: between it and vLLM's defaults, what the
        # configuration costs; between it and the rollout, what the server's path (Ray, verl, the agent loop) costs
        configured = measure_ceiling("vllm_configured", {
            **requests, "engine_args": configured_engine_args(cfg["actor_rollout_ref"]["rollout"]),
            "without_logprobs": True}, out)
        steps_measured = max(1, len(steps))
        one_step = lengths["total"][: len(lengths["total"]) // steps_measured]
        tuned = result["tuned"]
        train = measure_ceiling("train", {"model": str(model), "lengths": one_step,
                                          "token_budget": tuned["actor_rollout_ref.actor.ppo_max_token_len_per_gpu"] or 16384,
                                          "checkpointing": bool(tuned["actor_rollout_ref.model.enable_gradient_checkpointing"])},
                                out)
        result["ceilings"] = {"vllm_generate": vllm, "vllm_configured": configured, **train}
        result["ratio_to_ceiling"] = ratios(result["phases"], numbers["step"], vllm, train, configured)
    if args.earlier:  # the headline numbers over this launch and the last one of the same job (launches.py)
        from benchmarks.launches import with_earlier
        from benchmarks.record import machine

        result = with_earlier(result, machine().get("gpu"), Path(args.earlier))
    emit("gpu_step", result)


def _vocab(model: Path) -> int:
    return json.loads((model / "config.json").read_text())["vocab_size"]


if __name__ == "__main__":
    main()
