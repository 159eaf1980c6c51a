"""verl's two log-prob kernels side by side on one GPU: the per-token log-probs and entropy of a batch of
hidden states under the LM head, as the actor computes them for old log-probs (forward) and the update
(forward + backward).

  torch:  `FusedLinearForPPO` (verl/utils/experimental/torch_functional.py), 512-row chunks in a Python loop
  triton: `linear_cross_entropy` (verl/utils/kernel), one Triton kernel over the whole batch
  plain:  `hidden @ W.T` -> fp32 log_softmax -> gather (materializes [T, V] fp32 logits; the reference)

`actor_rollout_ref.model.fused_kernel_options.impl_backend` picks between the first two. Prints one JSON line:
seconds (median of 5 after a warm-up) per kernel and pass, and the largest log-prob difference to `plain`.

    .venv/bin/python benchmarks/fused_logprob.py --tokens 40000 --hidden 1024 --vocab 635
    .venv/bin/python benchmarks/fused_logprob.py --tokens 16384 --hidden 2560 --vocab 151936
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.record import emit  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=40000)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--vocab", type=int, default=635)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--device", default="cuda", help="cuda, or cpu (the Triton kernel then reports an error)")
    args = ap.parse_args(argv)

    import torch

    from verl.utils.experimental.torch_functional import FusedLinearForPPO
    from verl.utils.kernel.linear_cross_entropy import linear_cross_entropy

    if args.device == "cuda" and not torch.cuda.is_available():
        print("fused_logprob: no CUDA GPU here (--device cpu times the torch kernels on the CPU)", file=sys.stderr)
        raise SystemExit(2)
    device = torch.device(args.device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    gen = torch.Generator(device=device).manual_seed(0)
    hidden = torch.randn(args.tokens, args.hidden, device=device, dtype=torch.bfloat16, generator=gen)
    weight = (torch.randn(args.vocab, args.hidden, device=device, dtype=torch.bfloat16, generator=gen)
              / args.hidden ** 0.5)
    labels = torch.randint(0, args.vocab, (args.tokens,), device=device, generator=gen)

    def plain(h, w):
        logp = (h @ w.t()).float().log_softmax(-1)
        return logp.gather(-1, labels[:, None])[:, 0], None

    kernels = {
        "torch": lambda h, w: FusedLinearForPPO(impl_backend="torch")(h, w, labels, 1.0),
        "triton": lambda h, w: linear_cross_entropy(h, w, labels, 1.0, "none"),
        "plain": plain,
    }

    def timed(fn, backward: bool) -> float:
        times = []
        for i in range(args.repeats + 1):
            h = hidden.detach().requires_grad_(backward)
            w = weight.detach().requires_grad_(backward)
            sync()
            t0 = time.perf_counter()
            with torch.set_grad_enabled(backward):
                logp, entropy = fn(h, w)
                if backward:  # contiguous output grads, as the actor's loss gives them (the Triton kernel asserts it)
                    outs = [t for t in (logp, entropy) if t is not None]
                    torch.autograd.backward(outs, [torch.ones_like(t) for t in outs])
            sync()
            if i:
                times.append(time.perf_counter() - t0)
        return statistics.median(times)

    with torch.no_grad():
        reference = plain(hidden, weight)[0]
    result = {"bench": "fused_logprob", "tokens": args.tokens, "hidden": args.hidden, "vocab": args.vocab,
              "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu"}
    for name, fn in kernels.items():
        try:
            with torch.no_grad():
                logp = fn(hidden, weight)[0]
            result[name] = {"max_abs_diff_vs_plain": float((logp.float() - reference).abs().max()),
                            "forward_s": round(timed(fn, False), 5)}
            result[name]["forward_backward_s"] = round(timed(fn, True), 5)
        except Exception as exc:  # a kernel that cannot run here is reported, not fatal
            where = traceback.extract_tb(exc.__traceback__)[-1]
            result[name] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}",
                            "at": f"{where.filename.split('site-packages/')[-1]}:{where.lineno}: {where.line}"}
        if device.type == "cuda":
            torch.cuda.empty_cache()
    emit("fused_logprob", result)


if __name__ == "__main__":
    main()
