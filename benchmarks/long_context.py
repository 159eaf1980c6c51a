"""Long multi-turn on verl with the tuned defaults: 8 tool turns, ~8k tokens per trajectory, no OOM.

    python benchmarks/long_context.py --shape qwen3-0.6b --steps 2

A random-init model never calls a tool, so the Qwen3 shape (builtin tokenizer, as in gpu_step.py) first
gets a short supervised warm start on transcripts that call the `next_page` function tool after every
observation. The tool returns ~1k tokens of text, `env.max_turns=8`: every trajectory runs 8 turns and
ends near 8k tokens. Then `--steps` verl steps of 16 prompts x 8 rollouts run with the defaults of
configs/verl.yaml and the tuned plan (nothing about memory is set by hand). Prints one JSON line: turns
and sequence lengths per trajectory, per-phase step times, peak GPU memory, the settings the plan chose.
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.record import emit  # noqa: E402
from benchmarks.gpu_step import parse_args, run_verl  # noqa: E402
from benchmarks.job_config import select  # noqa: E402
from benchmarks.shapes import build_shape  # noqa: E402
from benchmarks.step_metrics import step_numbers  # noqa: E402

TOOL_FILE = Path(__file__).with_name("long_context_tool.py")



def write_task(out: Path, rows: int = 64) -> tuple[Path, Path]:
    manifest = out / "long_tools.yaml"
    manifest.write_text(f"functions:\n  - {TOOL_FILE}:next_page\n")
    data = out / "long_task.jsonl"
    rng = random.Random(0)
    with data.open("w") as f:
        for i in range(rows):
            f.write(json.dumps({"prompt": f"Read the report page by page (id {rng.randrange(10**6)}).",
                                "answer": str(i)}) + "\n")
    return manifest, data


def manifest_tools(manifest: Path) -> list[dict]:
    """The tool schemas exactly as the agent loop will put them in the prompt."""
    import asyncio

    from rl_factory.components import EnvConfig, open_env

    async def tools():
        async with open_env(EnvConfig(tools=str(manifest))) as env:
            return await env.list_tools()

    return asyncio.run(tools())


def warm_start(model_dir: Path, tools: list[dict], steps: int, turns: int) -> Path:
    """Teach the random model the one habit the test needs: call next_page after every observation."""
    import torch

    import rl_factory.models.varlen_attention  # noqa: F401 - registers rl_factory_varlen
    from benchmarks.long_context_tool import next_page
    from rl_factory.backends.verl.tuning import attention_implementation
    from rl_factory.chat import ChatFormat
    from rl_factory.models.warmstart import tokenize_transcript

    target = model_dir.with_name(model_dir.name + "-next-page")
    if (target / "config.json").exists():
        return target
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32,
                                                 attn_implementation=attention_implementation()).cuda()
    fmt = ChatFormat(tok, tools)
    call = {"role": "assistant", "content": "",
            "tool_calls": [{"type": "function", "function": {"name": "next_page", "arguments": {}}}]}
    rng = random.Random(0)
    examples = []
    for i in range(64):
        messages = [{"role": "user", "content": f"Read the report page by page (id {rng.randrange(10**6)})."}]
        for page in range(turns):
            messages += [call, {"role": "tool", "name": "next_page", "content": next_page(page=i * turns + page)}]
        messages.append({"role": "assistant", "content": "Done."})
        examples.append(tokenize_transcript(fmt, messages))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model.train()
    for step in range(steps):
        batch = [examples[(step * 2 + k) % len(examples)] for k in range(2)]
        ids = torch.tensor([t for e in batch for t in e[0]], device="cuda")[None]
        mask = torch.tensor([m for e in batch for m in e[1]], device="cuda")[None].bool()
        pos = torch.cat([torch.arange(len(e[0]), device="cuda") for e in batch])[None]
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(input_ids=ids, position_ids=pos).logits.float()
        loss = torch.nn.functional.cross_entropy(logits[0, :-1][mask[0, 1:]], ids[0, 1:][mask[0, 1:]])
        loss.backward()
        opt.step(), opt.zero_grad(set_to_none=True)
        if step % 10 == 0 or step == steps - 1:
            print(f"warm start {step}: loss {loss.item():.4f}", file=sys.stderr, flush=True)
    model.to(torch.bfloat16).save_pretrained(target)
    tok.save_pretrained(target)
    for extra in ("generation_config.json", "chat_template.jinja"):
        if (model_dir / extra).exists():
            (target / extra).write_bytes((model_dir / extra).read_bytes())
    return target


def job_args(steps: int, turns: int, timeout: float, manifest: Path, data: Path, overrides=()) -> argparse.Namespace:
    """gpu_step.py's own arguments for the verl job (built by its parser, so a field it adds reaches this job too):
    64 tokens a turn, room for `turns` turns of ~1k-token observations, the task's tool and data."""
    return parse_args([
        "--steps", str(steps), "--batch", "16", "--n", "8", "--max-response-tokens", "64", "--max-total-tokens", "9216",
        "--max-turns", str(turns), "--timeout", str(timeout), "--no-ceilings", "--",
        f"env.tools={manifest}", f"data.train_files={data}", f"data.val_files={data}",
        "rollout.max_tool_response_tokens=1536", "data.max_prompt_length=1024", *overrides])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="qwen3-0.6b")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--turns", type=int, default=8)
    ap.add_argument("--warm-start-steps", type=int, default=60)
    ap.add_argument("--out", default=str(ROOT / "outputs" / "long_context"))
    ap.add_argument("--timeout", type=float, default=1800, help="seconds before the verl job is stopped")
    ap.add_argument("--prepare", action="store_true", help="only build the shape and its warm start, then exit")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    manifest, data = write_task(out)
    t0 = time.perf_counter()
    model = warm_start(build_shape(args.shape, out), manifest_tools(manifest), args.warm_start_steps, args.turns)
    warm_s = time.perf_counter() - t0
    if args.prepare:
        print(json.dumps({"bench": "long_context_prepare", "model": str(model), "s": round(warm_s, 1)}))
        return
    run_args = job_args(args.steps, args.turns, args.timeout, manifest, data, args.overrides)
    run_dir = out / f"run-{time.strftime('%H%M%S')}"
    lines, wall, _ = run_verl(run_args, model, run_dir)
    numbers = step_numbers(lines, args.steps)
    from rl_factory.jsonl import read_records

    rollouts = [r for p in sorted((run_dir / "rollouts").glob("step_*.jsonl")) for r in read_records(p)]
    import yaml

    cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
    emit("long_context", {
        "bench": "long_context", "shape": args.shape, "steps_done": len(lines), "warm_start_s": round(warm_s, 1),
        "trajectories": len(rollouts), "mean_turns": statistics.fmean(r["num_turns"] for r in rollouts),
        "min_turns": min(r["num_turns"] for r in rollouts),
        "mean_total_tokens": statistics.fmean(r["total_tokens"] for r in rollouts),
        "max_total_tokens": max(r["total_tokens"] for r in rollouts),
        "tool_success_rate": statistics.fmean(res["error_kind"] is None for r in rollouts for res in r["tool_results"]),
        "step_s": numbers["step"], "all_step_s": numbers["all_step_s"], "generate_s": numbers["generate"],
        "old_log_prob_s": numbers["old_log_prob"], "update_s": numbers["update"],
        "tokens_per_step": numbers["total_tokens"], "job_wall_s": round(wall, 1),
        "memory_gb": {"max_allocated": numbers["max_memory_allocated_gb"], "max_reserved": numbers["max_memory_reserved_gb"]},
        "tuned": {k: select(cfg, k) for k in ("actor_rollout_ref.model.enable_gradient_checkpointing",
                                              "actor_rollout_ref.actor.ppo_max_token_len_per_gpu",
                                              "actor_rollout_ref.rollout.gpu_memory_utilization")},
    })


if __name__ == "__main__":
    main()
