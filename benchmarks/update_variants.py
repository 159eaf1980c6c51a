"""The actor update's micro-batch size and optimizer, measured without vLLM or Ray: time and allocator peak.

What verl's FSDP actor does on one GPU, built from torch alone: a randomly initialized Qwen3 shape
(`benchmarks/shapes.py`) in fp32, wrapped by FSDP (world size 1) with verl's mixed precision (bf16 compute,
fp32 reduction), a decoder layer per FSDP unit, gradient checkpointing as the tuning turns it on, packed
micro-batches through `rl_factory_varlen` attention, per-token log-probs from the LM head in 1,024-token
chunks (recomputed in the backward, as the fused kernels keep no [tokens, vocab] logits), then one AdamW
step. Per variant (micro-batch token budget x AdamW implementation) it reports the seconds of the
forward+backward over all micro-batches, of the optimizer step, and the allocator's peak in each.
`--wrap plain` runs the same model as TRL's trainer does on one GPU instead: no FSDP, fp32 weights under
bf16 autocast (its variants are named `plain:foreach/4409`): what verl's FSDP wrap costs at world size 1.

    .venv/bin/python benchmarks/update_variants.py --shape qwen3-4b --micro 4409 10299 --optimizer foreach fused
    .venv/bin/python benchmarks/update_variants.py --shape qwen3-4b --micro 10299 --optimizer fused --wrap fsdp plain

Prints one JSON line (`benchmarks/results/update_variants.jsonl` keeps the records). Needs a CUDA GPU
(`--device cpu` runs the same code on a small shape, for its test).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.ceilings import micro_batches  # noqa: E402
from benchmarks.record import emit  # noqa: E402
from benchmarks.shapes import SHAPES, shape_config  # noqa: E402

CHUNK = 1024  # tokens of LM-head logits alive at once


def build(shape: str, vocab: int, device, checkpointing: bool, wrap: str = "fsdp"):
    import torch.distributed as dist
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import MixedPrecision
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy
    from transformers import AutoModelForCausalLM

    import rl_factory.models.varlen_attention as varlen

    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(
            shape_config(shape, vocab_size=vocab, attn_implementation=varlen.NAME), dtype=torch.float32)
    model.train()  # transformers checkpoints only in training mode
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if wrap == "plain" or device.type != "cuda":  # FSDP needs an accelerator: on the CPU the rest runs, in fp32
        return Actor(model)
    if not dist.is_initialized():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29517")
        dist.init_process_group("nccl", rank=0, world_size=1)
    layer = type(model.model.layers[0])
    mp = MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.float32, buffer_dtype=torch.float32)
    return FSDP(Actor(model), auto_wrap_policy=ModuleWrapPolicy({layer}), mixed_precision=mp, device_id=device,
                use_orig_params=False)


class Actor(torch.nn.Module):
    """The decoder and the per-token log-probs in one forward, so that FSDP's root unit gathers the LM head."""

    def __init__(self, lm):
        super().__init__()
        self.lm = lm

    def forward(self, input_ids, position_ids):
        hidden = self.lm.model(input_ids=input_ids, position_ids=position_ids)[0]
        return token_log_probs(self.lm.lm_head.weight, hidden[0, :-1], input_ids[0, 1:])


def token_log_probs(weight, hidden, labels):
    """log p(label) per token from the LM head, 1,024 tokens of logits at a time (recomputed in the backward)."""
    from torch.utils.checkpoint import checkpoint

    def chunk(h, y):
        return torch.log_softmax((h @ weight.t()).float(), -1).gather(-1, y[:, None])[:, 0]

    return torch.cat([checkpoint(chunk, hidden[i:i + CHUNK], labels[i:i + CHUNK], use_reentrant=False)
                      for i in range(0, hidden.shape[0], CHUNK)])


def run_variant(model, opt, lengths, budget, vocab, device, repeats, autocast: bool = False):
    """The update's forward+backward over `lengths` packed into micro-batches of `budget` tokens, then one
    optimizer step, `repeats` times after a warm-up; `autocast`: bf16 autocast around the forward (TRL's way)."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    gen = torch.Generator(device=device).manual_seed(0)
    packed = []
    for batch in micro_batches(lengths, budget):
        ids = torch.randint(0, vocab, (1, sum(batch)), device=device, generator=gen)
        pos = torch.cat([torch.arange(n, device=device) for n in batch])[None]
        packed.append((ids, pos))
    fb, step, fb_peak, step_peak = [], [], [], []
    for i in range(repeats + 1):  # the first is a warm-up (the optimizer's state is created there)
        opt.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        sync()
        t0 = time.perf_counter()
        for ids, pos in packed:
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
                logp = model(ids, pos)
            (-logp.mean() / len(packed)).backward()
        sync()
        t1 = time.perf_counter()
        peak_fb = torch.cuda.max_memory_allocated() if device.type == "cuda" else 0
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        opt.step()
        sync()
        t2 = time.perf_counter()
        if i:
            fb.append(t1 - t0)
            step.append(t2 - t1)
            fb_peak.append(peak_fb)
            step_peak.append(torch.cuda.max_memory_allocated() if device.type == "cuda" else 0)
    gib = 1024**3
    return {"micro_batches": len(packed), "forward_backward_s": round(statistics.median(fb), 4),
            "optimizer_step_s": round(statistics.median(step), 4),
            "forward_backward_peak_gib": round(max(fb_peak) / gib, 2), "optimizer_peak_gib": round(max(step_peak) / gib, 2)}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), default="qwen3-4b")
    ap.add_argument("--vocab", type=int, default=None, help="the shape's (qwen3-4b: 151,936), else 635")
    ap.add_argument("--micro", type=int, nargs="+", default=[4409, 10299], help="micro-batch token budgets")
    ap.add_argument("--optimizer", nargs="+", choices=["foreach", "fused"], default=["foreach", "fused"])
    ap.add_argument("--tokens", type=int, default=40960, help="tokens of one update (the 4B job's ~41k)")
    ap.add_argument("--sequence", type=int, default=320, help="tokens of each packed sequence")
    ap.add_argument("--no-checkpointing", action="store_true")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--wrap", nargs="+", choices=["fsdp", "plain"], default=["fsdp"],
                    help="fsdp: verl's wrap (world size 1, bf16 compute); plain: no FSDP, bf16 autocast (TRL's)")
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("update_variants: no CUDA GPU here (--device cpu runs it on the CPU)", file=sys.stderr)
        raise SystemExit(2)
    device = torch.device(args.device)
    vocab = args.vocab or SHAPES[args.shape].get("vocab_size", 635)
    lengths = [args.sequence] * (args.tokens // args.sequence)
    result = {"bench": "update_variants", "shape": args.shape, "vocab": vocab, "tokens": sum(lengths),
              "sequence": args.sequence, "checkpointing": not args.no_checkpointing, "params": None,
              "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu", "variants": {}}
    for wrap in args.wrap:  # one model at a time: two 4B copies with their Adam state do not fit beside each other
        model = build(args.shape, vocab, device, not args.no_checkpointing, wrap)
        result["params"] = sum(p.numel() for p in model.parameters())
        for name in args.optimizer:
            # verl's build_optimizer: torch.optim.AdamW with lr, weight decay, betas, and override_optimizer_config
            opt = torch.optim.AdamW(model.parameters(), lr=1e-6, weight_decay=0.01, betas=(0.9, 0.999),
                                    **({"fused": True} if name == "fused" else {"foreach": True}))
            for budget in args.micro:
                key = f"{name}/{budget}" if wrap == "fsdp" else f"{wrap}:{name}/{budget}"
                try:
                    result["variants"][key] = run_variant(model, opt, lengths, budget, vocab, device, args.repeats,
                                                          autocast=wrap == "plain" and device.type == "cuda")
                except torch.OutOfMemoryError as exc:  # a variant that does not fit is a result; the others still run
                    result["variants"][key] = {"failed": f"out of memory: {str(exc).split('. ')[0]}"}
                    print(f"update_variants: {key} ran out of memory", file=sys.stderr)
                    opt.zero_grad(set_to_none=True)
                    if device.type == "cuda":
                        torch.cuda.empty_cache()
            del opt
            if device.type == "cuda":
                torch.cuda.empty_cache()
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()
    emit("update_variants", result)


if __name__ == "__main__":
    main()
