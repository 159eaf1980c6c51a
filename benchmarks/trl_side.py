"""TRL's side of benchmarks/vs_trl.py: GRPOTrainer on the job a spec file describes, in a process of its own.

`run_trl` (called by vs_trl.py) writes the spec, starts `python benchmarks/trl_side.py SPEC` (`trl_worker`,
with its output in `worker.log`), samples the device's used memory while it runs (benchmarks/gpu_memory.py)
and sums the steps up. The worker writes, into the spec's `out`:

- `steps.json`: per training step its seconds and their split (`generate_s` without the weight copy into
  vLLM, `weight_sync_s`, `tools_s`, `reward_s`, `old_log_prob_s` (TRL's no-grad forward for its vLLM
  importance-sampling correction, when that is on), `rollout_s` (TRL's `_generate_and_score_completions`,
  all of the above), `update_s` (the rest of the step: forward+backward of every micro-batch and the
  optimizer step)), TRL's logged reward and completion lengths, and on a GPU the process's peak torch
  memory so far. Rewritten after every step, so a job stopped by its timeout leaves the steps it finished.
- `memory.json` (GPU only, rewritten after every step): the peak memory of the process's torch allocator
  (vLLM's tensors included: it runs in this process), the device's used memory at step ends
  (torch.cuda.mem_get_info), what vLLM took when it started (the device's used memory before and after),
  its budget (`vllm_gpu_memory_utilization` x the GPU) and its KV cache, where vLLM says how many blocks
  it made.
- `final/`: the trained model, when the spec asks for it.

On a GPU the timers synchronize CUDA where a phase ends, so a phase is not billed for the kernels of the
one before.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from benchmarks.gpu_memory import DevicePeak  # noqa: E402
from rl_factory.jsonl import read_records  # noqa: E402
TRAIN_FILE = ROOT / "examples" / "calculator" / "data" / "train.jsonl"
GIB = 2**30


def trl_missing() -> str | None:
    """Why TRL's side cannot run here (trl or datasets not importable), or None."""
    import importlib

    try:
        for name in ("trl", "datasets"):
            importlib.import_module(name)
    except ImportError as exc:
        return f"TRL is not installed ({exc})"
    return None


def run_trl(args, out: Path, tools: list[dict], model_dir: Path, env: dict, job: dict[str, Any],
            settings: dict[str, Any] | None = None) -> dict[str, Any]:
    """TRL in a process of its own, like ours (same threads, a fresh interpreter); its output in out/worker.log.

    `settings` go into the worker's spec as they are (trl_side.py: micro_batch, gradient_checkpointing,
    vllm_importance_sampling_correction, vllm_enable_sleep_mode, save). The device's used memory is sampled from
    here while it runs.
    """
    out.mkdir(parents=True, exist_ok=True)
    spec = {"out": str(out), "model": str(model_dir), "schema": tools[0], "steps": args.steps,
            "latency_s": args.tool_latency_ms / 1000, "seed": args.seed, "job": job, "device": args.device,
            "vllm": args.vllm, "vllm_memory": args.vllm_memory, "micro_batch": args.micro_batch, **(settings or {})}
    (out / "spec.json").write_text(json.dumps(spec))
    (out / "steps.json").unlink(missing_ok=True)
    log = out / "worker.log"
    start = time.perf_counter()
    with log.open("w") as sink, DevicePeak() as device:
        proc = subprocess.Popen([sys.executable, __file__, str(out / "spec.json")], cwd=ROOT, env=env,
                                stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            code = proc.wait(timeout=args.timeout)
        except subprocess.TimeoutExpired:  # keep what finished: steps.json is rewritten after every step
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            code = "timeout"
    wall = time.perf_counter() - start
    steps = json.loads((out / "steps.json").read_text()) if (out / "steps.json").exists() else []
    if code != 0 and not steps:  # a record still: what stopped it (TRL out of GPU memory is a result)
        text = log.read_text(errors="replace")
        print(f"vs_trl: the TRL run ended with {code}; {log}:\n{text[-3000:]}", file=sys.stderr)
        return {"failed": f"ended with {code} before its first step's end", "error": last_error(text),
                "wall_s": round(time.perf_counter() - start, 1), "log": str(log),
                **({"memory_gb": {"device_peak_used": device.result()["peak_used_gb"]}} if device.result() else {})}
    timed = steps[1:] if len(steps) > 1 else steps  # step 1 also builds TRL's caches; ours has no such cost
    result = step_stats([s["step_s"] for s in timed])
    result["split"] = {k: round(statistics.fmean(s[k] for s in timed), 4)
                       for k in ("generate_s", "tools_s", "reward_s", "update_s", "rollout_s")}
    result["phases"] = phase_medians(timed)
    result["all_step_s"] = [round(s["step_s"], 3) for s in steps]
    result["all_steps_spread"] = step_stats([s["step_s"] for s in steps])["spread"]
    result["first_step_s"] = round(steps[0]["step_s"], 3)
    result["wall_s"] = round(wall, 1)
    if code != 0:
        result["stopped"] = f"{code} after {len(steps)} of {args.steps} steps"
    rewards = [s["reward"] for s in steps if "reward" in s]
    result["train_reward_last5"] = round(statistics.fmean(rewards[-5:]), 3) if rewards else None
    lengths = [s["mean_completion_tokens"] for s in timed if "mean_completion_tokens" in s]
    result["mean_completion_tokens"] = round(statistics.median(lengths), 1) if lengths else None
    memory = json.loads((out / "memory.json").read_text()) if (out / "memory.json").exists() else {}
    if memory or device.result():
        result["memory_gb"] = {**memory, "device_peak_used": (device.result() or {}).get("peak_used_gb")}
    if spec.get("save", True) and code == 0:
        result["final_model"] = str(out / "final")
    return result


def last_error(log: str) -> str | None:
    """The last line of `log` that names an exception (`...Error: ...`), without torchrun's `[rank0]:` prefix."""
    lines = [line.split("]: ", 1)[-1] if line.startswith("[rank") else line for line in log.splitlines()]
    errors = [line.strip() for line in lines if re.match(r"^\s*[\w.]+(Error|Exception): ", line)]
    return errors[-1][:500] if errors else None


def phase_medians(steps: list[dict]) -> dict[str, float]:
    """Per phase, the median over `steps` of its seconds, named as gpu_step.py names ours' phases.

    `rollout` is TRL's rollout without the weight copy and old-log-prob pass inside it (ours times those apart):
    generation, tools, reward and TRL's bookkeeping between them.
    """
    def median(key) -> float:
        return round(statistics.median(key(s) for s in steps), 4)

    return {"rollout": median(lambda s: s["rollout_s"] - s.get("weight_sync_s", 0.0) - s.get("old_log_prob_s", 0.0)),
            "generate": median(lambda s: s["generate_s"]), "tools": median(lambda s: s["tools_s"]),
            "reward": median(lambda s: s["reward_s"]), "old_log_prob": median(lambda s: s.get("old_log_prob_s", 0.0)),
            "update": median(lambda s: s["update_s"]), "update_weights": median(lambda s: s.get("weight_sync_s", 0.0)),
            "step": median(lambda s: s["step_s"])}


def step_stats(times: list[float]) -> dict[str, Any]:
    median = statistics.median(times)
    return {"s_per_step": round(statistics.fmean(times), 3), "median_s": round(median, 3),
            "max_s": round(max(times), 3), "spread": round(max(times) / median, 2), "steps_timed": len(times)}


def kv_cache(llm: Any, model_dir: str) -> dict[str, Any]:
    """vLLM's KV cache size from its block count (set in this process: TRL runs vLLM's engine in-process)."""
    try:
        cache = llm.llm_engine.vllm_config.cache_config
        blocks, block_size = int(cache.num_gpu_blocks or 0), int(cache.block_size)
    except (AttributeError, TypeError, ValueError):
        return {}
    if not blocks:
        return {}
    cfg = json.loads((Path(model_dir) / "config.json").read_text())
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    per_token = 2 * cfg["num_hidden_layers"] * cfg["num_key_value_heads"] * head_dim * 2  # K and V, bf16
    return {"vllm_kv_cache_tokens": blocks * block_size, "vllm_kv_cache_gb": round(blocks * block_size * per_token / GIB, 2)}


def trl_worker(spec: dict) -> None:
    """Train with TRL's GRPOTrainer; writes steps.json, memory.json (GPU) and the final model (spec['save'])."""
    import datasets
    import torch
    import transformers.utils.chat_template_utils as chat_utils
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer
    from trl import chat_template_utils as trl_chat

    from envs.servers.calculator import CalculatorError, evaluate as calc, format_number
    from rewards.exact_match import numeric_exact_match

    out, cuda = Path(spec["out"]), spec["device"] == "cuda"
    timers: dict[str, float] = {}
    memory: dict[str, Any] = {}

    def device_used_gb() -> float:
        free, total = torch.cuda.mem_get_info()
        return (total - free) / GIB

    @contextlib.contextmanager
    def timed(name: str):
        start = time.perf_counter()
        try:
            yield
        finally:
            if cuda:
                torch.cuda.synchronize()
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

    if spec["vllm"]:  # the weight copy into vLLM (inside TRL's generation call) and what vLLM takes at start
        from trl.generation import vllm_generation

        start_vllm, sync_weights = vllm_generation.VLLMGeneration._init_vllm, vllm_generation.VLLMGeneration.sync_weights

        def measured_start(self):
            before = device_used_gb()
            start_vllm(self)
            memory["vllm_start_gb"] = round(device_used_gb() - before, 2)
            memory.update(kv_cache(self.llm, spec["model"]))

        def timed_sync(self):
            with timed("weight_sync_s"):
                return sync_weights(self)

        vllm_generation.VLLMGeneration._init_vllm = measured_start
        vllm_generation.VLLMGeneration.sync_weights = timed_sync

    class Timed(GRPOTrainer):
        def _generate_single_turn(self, *a, **k):
            with timed("generate_s"):
                return super()._generate_single_turn(*a, **k)

        def _generate_and_score_completions(self, *a, **k):
            with timed("rollout_s"):
                return super()._generate_and_score_completions(*a, **k)

        def _get_per_token_logps_and_entropies(self, *a, **k):
            if torch.is_grad_enabled():  # the update's own forward
                return super()._get_per_token_logps_and_entropies(*a, **k)
            with timed("old_log_prob_s"):  # TRL's extra pass for its vLLM importance-sampling correction
                return super()._get_per_token_logps_and_entropies(*a, **k)

    steps: list[dict] = []
    phases = ("generate_s", "weight_sync_s", "tools_s", "reward_s", "old_log_prob_s", "rollout_s")
    logged = {"reward": "reward", "completions/mean_length": "mean_completion_tokens",
              "completions/max_length": "max_completion_tokens", "tools/call_frequency": "tool_call_frequency"}

    class StepTimes(TrainerCallback):
        def on_step_begin(self, *_, **__):
            if cuda:
                torch.cuda.synchronize()
            timers.clear()
            self.start = time.perf_counter()

        def on_step_end(self, *_, **__):
            if cuda:
                torch.cuda.synchronize()
            step = time.perf_counter() - self.start
            record = {k: timers.get(k, 0.0) for k in phases}
            record["generate_s"] -= record["weight_sync_s"]  # TRL copies the weights inside its generation call
            record.update(step_s=step, update_s=step - record["rollout_s"])
            steps.append(record)
            if cuda:
                record.update(max_allocated_gb=torch.cuda.max_memory_allocated() / GIB,
                              max_reserved_gb=torch.cuda.max_memory_reserved() / GIB, device_used_gb=device_used_gb())
                memory.update(max_allocated_gb=round(record["max_allocated_gb"], 2),
                              max_reserved_gb=round(record["max_reserved_gb"], 2),
                              max_device_used_gb=round(max(s["device_used_gb"] for s in steps), 2))
                (out / "memory.json").write_text(json.dumps(memory))
            (out / "steps.json").write_text(json.dumps(steps))

        def on_log(self, _args, _state, _control, logs=None, **__):
            if logs and steps:
                steps[-1].update({name: logs[key] for key, name in logged.items() if key in logs})
                (out / "steps.json").write_text(json.dumps(steps))

    rows = read_records(TRAIN_FILE)
    data = datasets.Dataset.from_list([{"prompt": [{"role": "user", "content": r["prompt"]}],
                                        "answer": r["answer"]} for r in rows])
    tokenizer = AutoTokenizer.from_pretrained(spec["model"])
    # TRL parses the model's <tool_call>{json}</tool_call> (Hermes / Qwen3) with a response template
    # (transformers >= 5.13) or the legacy response schema (older: this venv's transformers 5.10, verl's pin).
    if getattr(trl_chat, "_SUPPORTS_RESPONSE_TEMPLATE", False):
        tokenizer.response_template = trl_chat.qwen3_template
    else:
        tokenizer.response_schema = trl_chat.qwen3_schema
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    # fp32 weights and optimizer state, bf16 autocast on a GPU: what verl's FSDP actor keeps and computes in
    model = AutoModelForCausalLM.from_pretrained(spec["model"], dtype=torch.float32)
    job = spec["job"]
    batch = job["prompts"] * job["n"]
    micro = spec.get("micro_batch") or batch  # one optimizer step per generation batch either way
    if batch % micro:
        raise SystemExit(f"trl_side: micro_batch {micro} does not divide the {batch} sequences of a step")
    # per turn, as ours: vLLM's SamplingParams name it max_tokens, generate() max_new_tokens
    per_turn = {"max_tokens" if spec["vllm"] else "max_new_tokens": job["max_response_tokens"]}
    vllm = {"use_vllm": True, "vllm_mode": "colocate", "vllm_gpu_memory_utilization": spec["vllm_memory"],
            "vllm_max_model_length": job["max_total_tokens"] + 64} if spec["vllm"] else {}
    # set only where the spec says (a shape run matches ours' job); otherwise TRL's defaults, as before
    optional = {k: spec[k] for k in ("gradient_checkpointing", "vllm_importance_sampling_correction",
                                     "vllm_enable_sleep_mode") if k in spec}
    if not spec["vllm"]:
        optional.pop("vllm_importance_sampling_correction", None)
        optional.pop("vllm_enable_sleep_mode", None)
    config = GRPOConfig(
        output_dir=str(out), max_steps=spec["steps"], seed=spec["seed"], use_cpu=not cuda, bf16=cuda,
        per_device_train_batch_size=micro, gradient_accumulation_steps=batch // micro,
        num_generations=job["n"], temperature=job["temperature"], top_p=1.0,
        learning_rate=job["lr"], lr_scheduler_type="constant_with_warmup", warmup_steps=job["warmup_steps"],
        weight_decay=0.0, max_grad_norm=job["grad_clip"], beta=0.0, epsilon=0.2, loss_type="dapo",
        max_completion_length=job["max_total_tokens"] - 64,  # the prompt is ~60 tokens of the total
        generation_kwargs=per_turn, max_tool_calling_iterations=job["max_turns"] - 1,
        report_to="none", logging_steps=1, save_strategy="no", disable_tqdm=True, dataloader_num_workers=0,
        **vllm, **optional)
    trainer = Timed(model=model, reward_funcs=reward, args=config, train_dataset=data, processing_class=tokenizer,
                    tools=[calculator], callbacks=[StepTimes()])
    if cuda:
        total = torch.cuda.get_device_properties(0).total_memory / GIB
        memory.update(after_start_gb=round(device_used_gb(), 2), total_gb=round(total, 2))
        if spec["vllm"]:
            memory["vllm_budget_gb"] = round(spec["vllm_memory"] * total, 2)
        (out / "memory.json").write_text(json.dumps(memory))
    trainer.train()
    if spec.get("save", True):
        trainer.save_model(str(out / "final"))
    (out / "steps.json").write_text(json.dumps(steps))


if __name__ == "__main__":
    trl_worker(json.loads(Path(sys.argv[1]).read_text()))
