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
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
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
CALCULATOR_MANIFEST = ROOT / "configs" / "tools" / "calculator.yaml"
TRAIN_FILE = ROOT / "examples" / "calculator" / "data" / "train.jsonl"
# The job, as configs/grpo.yaml sets it for ours; TRL gets the same numbers below.
JOB = {"prompts": 16, "n": 8, "temperature": 1.0, "lr": 3e-4, "warmup_steps": 3, "grad_clip": 1.0,
       "max_turns": 3, "max_response_tokens": 64, "max_total_tokens": 512, "seed": 0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=40)
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
    parser.add_argument("--max-response-tokens", type=int, default=JOB["max_response_tokens"], help="per turn, both sides")
    parser.add_argument("--lr", type=float, default=JOB["lr"], help="both sides")
    parser.add_argument("--trl-worker", default=None, help=argparse.SUPPRESS)  # internal: run TRL's side
    args = parser.parse_args()
    if args.vllm and args.device != "cuda":
        parser.error("--vllm needs --device cuda")
    if args.trl_worker:
        trl_worker(json.loads(Path(args.trl_worker).read_text()))
        return
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="vs_trl-"))
    out.mkdir(parents=True, exist_ok=True)
    emit("vs_trl", run(args, out))


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
            result["trl"] = run_trl(args, out / "trl", tools, model_dir, env)
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


def job(args: argparse.Namespace) -> dict[str, Any]:
    """JOB with this invocation's seed and overrides: what both sides train."""
    return {**JOB, "seed": args.seed, "max_response_tokens": args.max_response_tokens, "lr": args.lr}


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
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
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
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


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


def step_stats(times: list[float]) -> dict[str, Any]:
    median = statistics.median(times)
    return {"s_per_step": round(statistics.fmean(times), 3), "median_s": round(median, 3),
            "max_s": round(max(times), 3), "spread": round(max(times) / median, 2), "steps_timed": len(times)}


def evaluate(model: str, out: Path, env: dict) -> float | None:
    cmd = ["bash", str(ROOT / "main_eval.sh"), f"model.path={model}", f"eval.output_dir={out}"]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        print(f"vs_trl: main_eval.sh failed for {model}:\n{proc.stderr[-2000:]}", file=sys.stderr)
        return None
    return json.loads((out / "results.json").read_text())["metrics"]["accuracy"]


# ---- TRL ----------------------------------------------------------------------------------------

def trl_missing() -> str | None:
    try:
        import trl  # noqa: F401
        import datasets  # noqa: F401
    except ImportError as exc:
        return f"TRL is not installed ({exc})"
    return None


def run_trl(args, out: Path, tools: list[dict], model_dir: Path, env: dict) -> dict[str, Any]:
    """TRL in a process of its own, like ours (same threads, a fresh interpreter)."""
    out.mkdir(parents=True, exist_ok=True)
    spec = {"out": str(out), "model": str(model_dir), "schema": tools[0], "steps": args.steps,
            "latency_s": args.tool_latency_ms / 1000, "seed": args.seed, "job": job(args), "device": args.device,
            "vllm": args.vllm, "vllm_memory": args.vllm_memory}
    (out / "spec.json").write_text(json.dumps(spec))
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, __file__, "--trl-worker", str(out / "spec.json")], cwd=ROOT, env=env,
                          capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"vs_trl: the TRL run failed:\n{proc.stderr[-3000:]}")
    steps = json.loads((out / "steps.json").read_text())
    timed = steps[1:] if len(steps) > 1 else steps  # step 1 also builds TRL's caches; ours has no such cost
    result = step_stats([s["step_s"] for s in timed])
    result["split"] = {k: round(statistics.fmean(s[k] for s in timed), 4)
                       for k in ("generate_s", "tools_s", "reward_s", "update_s", "rollout_s")}
    result["all_steps_spread"] = step_stats([s["step_s"] for s in steps])["spread"]
    result["first_step_s"] = round(steps[0]["step_s"], 3)
    result["wall_s"] = round(wall, 1)
    result["train_reward_last5"] = round(statistics.fmean(s["reward"] for s in steps[-5:]), 3)
    result["final_model"] = str(out / "final")
    return result


def trl_worker(spec: dict) -> None:
    """Train with TRL's GRPOTrainer (runs in its own process); writes steps.json and the final model."""
    import datasets
    import torch
    import transformers.utils.chat_template_utils as chat_utils
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer
    from trl import chat_template_utils as trl_chat

    from envs.servers.calculator import CalculatorError, evaluate as calc, format_number
    from rewards.exact_match import numeric_exact_match

    timers: dict[str, float] = {}

    @contextlib.contextmanager
    def timed(name: str):
        start = time.perf_counter()
        try:
            yield
        finally:
            timers[name] = timers.get(name, 0.0) + time.perf_counter() - start

    def calculator(expression: str) -> str:
        """Evaluate an arithmetic expression with + - * / // % ** and parentheses.

        Args:
            expression: the arithmetic expression
        """
        with timed("tools_s"):
            if spec["latency_s"]:
                time.sleep(spec["latency_s"])
            try:
                return format_number(calc(expression))
            except CalculatorError as err:
                return f"Error: {err}"

    # The prompt must be ours to the byte: render the tool with our MCP server's schema.
    schema_of = chat_utils.get_json_schema
    chat_utils.get_json_schema = lambda fn: spec["schema"] if fn is calculator else schema_of(fn)

    def reward(completions, answer, **_):
        with timed("reward_s"):
            finals = [next((m.get("content") or "" for m in reversed(c) if m["role"] == "assistant"), "")
                      for c in completions]
            return [numeric_exact_match(text, a) for text, a in zip(finals, answer)]

    class Timed(GRPOTrainer):
        def _generate_single_turn(self, *a, **k):
            with timed("generate_s"):
                return super()._generate_single_turn(*a, **k)

        def _generate_and_score_completions(self, *a, **k):
            with timed("rollout_s"):
                return super()._generate_and_score_completions(*a, **k)

    steps: list[dict] = []

    class StepTimes(TrainerCallback):
        def on_step_begin(self, *_, **__):
            timers.clear()
            self.start = time.perf_counter()

        def on_step_end(self, *_, **__):
            step = time.perf_counter() - self.start
            record = {k: timers.get(k, 0.0) for k in ("generate_s", "tools_s", "reward_s", "rollout_s")}
            record.update(step_s=step, update_s=step - record["rollout_s"])
            steps.append(record)

        def on_log(self, _args, _state, _control, logs=None, **__):
            if logs and "reward" in logs and steps:
                steps[-1]["reward"] = logs["reward"]

    rows = [json.loads(line) for line in TRAIN_FILE.read_text().splitlines()]
    data = datasets.Dataset.from_list([{"prompt": [{"role": "user", "content": r["prompt"]}],
                                        "answer": r["answer"]} for r in rows])
    tokenizer = AutoTokenizer.from_pretrained(spec["model"])
    # TRL parses the model's <tool_call>{json}</tool_call> (Hermes / Qwen3) with a response template
    # (transformers >= 5.13) or the legacy response schema (older: this venv's transformers 5.10, verl's pin).
    if getattr(trl_chat, "_SUPPORTS_RESPONSE_TEMPLATE", False):
        tokenizer.response_template = trl_chat.qwen3_template
    else:
        tokenizer.response_schema = trl_chat.qwen3_schema
    model = AutoModelForCausalLM.from_pretrained(spec["model"], dtype=torch.float32)
    job, cuda = spec["job"], spec["device"] == "cuda"
    # per turn, as ours: vLLM's SamplingParams name it max_tokens, generate() max_new_tokens
    per_turn = {"max_tokens" if spec["vllm"] else "max_new_tokens": job["max_response_tokens"]}
    vllm = {"use_vllm": True, "vllm_mode": "colocate", "vllm_gpu_memory_utilization": spec["vllm_memory"],
            "vllm_max_model_length": job["max_total_tokens"] + 64} if spec["vllm"] else {}
    config = GRPOConfig(
        output_dir=spec["out"], max_steps=spec["steps"], seed=spec["seed"], use_cpu=not cuda, bf16=cuda,
        per_device_train_batch_size=job["prompts"] * job["n"], gradient_accumulation_steps=1,
        num_generations=job["n"], temperature=job["temperature"], top_p=1.0,
        learning_rate=job["lr"], lr_scheduler_type="constant_with_warmup", warmup_steps=job["warmup_steps"],
        weight_decay=0.0, max_grad_norm=job["grad_clip"], beta=0.0, epsilon=0.2, loss_type="dapo",
        max_completion_length=job["max_total_tokens"] - 64,  # the prompt is ~60 tokens of the 512
        generation_kwargs=per_turn, max_tool_calling_iterations=job["max_turns"] - 1,
        report_to="none", logging_steps=1, save_strategy="no", disable_tqdm=True, dataloader_num_workers=0, **vllm)
    trainer = Timed(model=model, reward_funcs=reward, args=config, train_dataset=data, processing_class=tokenizer,
                    tools=[calculator], callbacks=[StepTimes()])
    trainer.train()
    trainer.save_model(str(Path(spec["out"]) / "final"))
    Path(spec["out"], "steps.json").write_text(json.dumps(steps))


if __name__ == "__main__":
    main()
