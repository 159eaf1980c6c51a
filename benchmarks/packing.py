"""The embedded update with shared-prefix packing against plain rows, on the same batch, in one invocation.

A step's trained samples are `--groups` prompts x `--n` continuations: each prompt `--prompt` tokens, each
continuation `--response` tokens (x0.5-1.5, seeded), random ids, advantage +-1 on the continuation. The
same policy update (`rl_factory.update.update_policy`, AdamW, one optimizer step, the configured micro-batch
token budget) runs `--repeats` times with `optim.shared_prefix` on and off, alternating, each from the same
weights. Prints one JSON line: the median seconds of each, tokens the forwards computed, the speedup, and
how far the two updates' gradients are apart (they compute the same function).

    .venv/bin/python benchmarks/packing.py                                    # the default job's shape, CPU
    python benchmarks/packing.py --shape qwen3-0.6b --device cuda --prompt 256 --response 256 --groups 16

`--model DIR` takes a Hugging Face model instead; `--shape tiny` is the builtin model's architecture
(random init), `qwen3-0.6b` / `qwen3-4b` Qwen3's (benchmarks/gpu_step.py, full vocabulary), both without a
tokenizer (pad id 0). On CUDA compute runs under bf16 autocast, as the embedded backend runs Qwen3.
"""
from __future__ import annotations

import argparse
import copy
import datetime
import os
import random
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from benchmarks.record import emit  # noqa: E402

TINY = {"hidden_size": 128, "intermediate_size": 384, "num_hidden_layers": 4, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 32, "vocab_size": 635}
QWEN3 = {"qwen3-0.6b": {"hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28,
                        "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936},
         "qwen3-4b": {"hidden_size": 2560, "intermediate_size": 9728, "num_hidden_layers": 36,
                      "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936}}


def build_policy(args):
    import torch
    from transformers import AutoModelForCausalLM, Qwen3Config

    from rl_factory.policy import Policy

    device = torch.device(args.device)
    if args.model:
        model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    else:
        torch.manual_seed(0)
        shape = TINY if args.shape == "tiny" else QWEN3[args.shape]
        model = AutoModelForCausalLM.from_config(Qwen3Config(**shape, tie_word_embeddings=True), dtype=torch.float32)
    model.config._attn_implementation = "sdpa"
    autocast = torch.bfloat16 if device.type == "cuda" else None
    return Policy(model.to(device).eval(), SimpleNamespace(pad_token_id=0), device, autocast, args.model or args.shape)


def make_batch(args, vocab: int):
    from rl_factory.types import Trajectory

    rng = random.Random(args.seed)
    trajs = []
    for g in range(args.groups):
        prompt = [rng.randrange(1, vocab) for _ in range(args.prompt)]
        for k in range(args.n):
            gen = [rng.randrange(1, vocab) for _ in range(max(1, round(args.response * rng.uniform(0.5, 1.5))))]
            ids = prompt + gen
            trajs.append(Trajectory(sample_index=g, prompt_ids=prompt, token_ids=ids,
                                    loss_mask=[0] * len(prompt) + [1] * len(gen), logprobs=[0.0] * len(ids),
                                    messages=[], turns=[], stop_reason="answer", advantage=1.0 if k % 2 else -1.0))
    return trajs


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model")
    ap.add_argument("--shape", default="tiny", choices=["tiny", *QWEN3])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--groups", type=int, default=16)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--prompt", type=int, default=59, help="prompt tokens (the default job's: 59)")
    ap.add_argument("--response", type=int, default=46, help="mean tokens after the prompt (default job: 46)")
    ap.add_argument("--micro-batch-tokens", type=int, default=8192)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    import torch

    from rl_factory.update import AlgorithmConfig, OptimConfig, update_policy

    policy = build_policy(args)
    trajs = make_batch(args, policy.model.config.vocab_size)
    start = copy.deepcopy(policy.model.state_dict())
    sync = torch.cuda.synchronize if policy.device.type == "cuda" else (lambda: None)

    def update(shared: bool) -> tuple[float, dict, dict]:
        policy.model.load_state_dict(start)
        optimizer = torch.optim.AdamW(policy.model.parameters(), lr=1e-5)
        sync()
        t0 = time.perf_counter()
        metrics = update_policy(policy, optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0), trajs,
                                AlgorithmConfig(), OptimConfig(lr=1e-5, micro_batch_tokens=args.micro_batch_tokens,
                                                               shared_prefix=shared))
        sync()
        return time.perf_counter() - t0, metrics, [p.grad.detach().float().clone() for p in policy.model.parameters()]

    update(True), update(False)  # warm up: kernels, the allocator, the packing check
    times, metrics, grads = {True: [], False: []}, {}, {}
    for _ in range(args.repeats):
        for shared in (True, False):
            seconds, metrics[shared], grads[shared] = update(shared)
            times[shared].append(seconds)
    packed, plain = statistics.median(times[True]), statistics.median(times[False])
    # the gradient the optimizer stepped with (left on the parameters), packed vs plain, relative to its largest entry
    grad_diff = max(float((a - b).abs().max()) for a, b in zip(grads[True], grads[False]))
    grad_scale = max(float(b.abs().max()) for b in grads[False])
    emit("packing", {
        "benchmark": "packing", "model": policy.path, "device": str(policy.device),
        "threads": torch.get_num_threads() if policy.device.type == "cpu" else None,
        "batch": {"groups": args.groups, "n": args.n, "prompt": args.prompt, "response": args.response,
                  "sample_tokens": sum(len(t.token_ids) for t in trajs)},
        "packed_used": policy.can_pack(),
        "packed_s": round(packed, 4), "plain_s": round(plain, 4), "speedup": round(plain / packed, 3),
        "all_s": {"packed": [round(t, 4) for t in times[True]], "plain": [round(t, 4) for t in times[False]]},
        "forward_tokens": {"packed": metrics[True]["actor/forward_tokens"], "plain": metrics[False]["actor/forward_tokens"]},
        "grad_max_abs": grad_scale, "grad_max_diff": grad_diff,
        "peak_gpu_gb": round(torch.cuda.max_memory_allocated() / 2**30, 2) if policy.device.type == "cuda" else None,
        "loadavg_1m": os.getloadavg()[0], "date": datetime.datetime.now().isoformat(timespec="seconds"),
    })


if __name__ == "__main__":
    main()
