"""Fingerprints of the weights a model computes with, for the receipts check (rl_factory/guard/checks/receipts.py):
the trainer's and the embedded engine's (rl_factory/engines/hf.py), and the vLLM workers' around each weight sync
(rl_factory/guard/syncs.py). Computed the same way everywhere, so the same tensors give the same bits."""
from __future__ import annotations

import hashlib


def weight_fingerprint(model) -> str:
    """A cheap fingerprint of the weights a model computes with: `sums_fingerprint`, then, for a peft model, the
    adapter's state (`adapter_part`): `<16 hex>` or `<16 hex>+lora<enabled>/<layers>.<8 hex>`."""
    return sums_fingerprint(model) + adapter_part(adapter_key(adapter_layers(model)))


def sums_fingerprint(model) -> str:
    """Every parameter's sum (float64), hashed.

    An optimizer step moves some sum in practice; it reads each weight once (no copy). CPU weights are
    summed by numpy, on the calling thread alone: torch's reductions wait at its thread team's barrier,
    which on a loaded machine turned 1 ms into up to a second. Computed the same way for the trainer's
    and the engine's model, so the same tensors give the same bits.
    """
    import numpy as np
    import torch

    params = list(model.parameters())
    with torch.no_grad():
        if all(p.device.type == "cpu" for p in params):
            sums = np.array([_numpy(p).sum(dtype=np.float64) for p in params], dtype=np.float64)
        else:  # one transfer for all the sums
            sums = torch.stack([device_sum(p.detach()) for p in params]).cpu().numpy()
    return hashlib.blake2b(sums.tobytes(), digest_size=8).hexdigest()


PARTIAL = 64  # values per float32 partial sum: one bf16 ulp of any of them still moves its partial


def device_sum(t):
    """The float64 sum of one device tensor, without the float64 copy of it that `torch.sum(t, dtype=float64)`
    makes for a bf16/fp16 tensor (8 bytes written and read per value: 1.2 GB for Qwen3's bf16 embedding, a spike
    in a vLLM worker whose KV cache has the rest of the GPU). Float32 partials of 64 values (torch reduces half
    precision into float32 without a copy), then their float64 sum: deterministic for the same tensor, and a
    change of one ulp of one value still moves it."""
    import torch

    if t.dtype not in (torch.bfloat16, torch.float16) or t.numel() < 16 * PARTIAL:
        return torch.sum(t, dtype=torch.float64)
    flat = t.reshape(-1)
    whole = flat.numel() // PARTIAL * PARTIAL
    total = torch.sum(torch.sum(flat[:whole].view(-1, PARTIAL), dim=1, dtype=torch.float32), dtype=torch.float64)
    return total + torch.sum(flat[whole:], dtype=torch.float64) if whole < flat.numel() else total


def adapter_layers(model) -> list:
    """The peft adapter layers of `model` (LoRA's `Linear`s and the like); [] for a plain model."""
    try:
        from peft.tuners.tuners_utils import BaseTunerLayer
    except ImportError:  # pragma: no cover - peft is a core dependency
        return []
    return [m for m in model.modules() if isinstance(m, BaseTunerLayer)]


def adapter_key(layers: list) -> tuple:
    """What each adapter layer computes with right now: disabled, its active adapters, how many are merged into
    the base weights, its scaling. Plain attributes only: the engine reads it in every forward."""
    return tuple((layer._disable_adapters, tuple(layer._active_adapter) if isinstance(layer._active_adapter, list)
                  else layer._active_adapter, len(layer.merged_adapters), tuple(getattr(layer, "scaling", {}).items()))
                 for layer in layers)


def adapter_part(key: tuple) -> str:
    """The fingerprint's adapter part: "" without adapters, else `+lora<enabled>/<layers>.<hash of the state>`."""
    if not key:
        return ""
    enabled = sum(not disabled for disabled, *_ in key)
    return f"+lora{enabled}/{len(key)}.{hashlib.blake2b(repr(key).encode(), digest_size=4).hexdigest()}"


def _numpy(param):
    t = param.detach()
    return (t.float() if t.dtype.itemsize < 4 and t.is_floating_point() else t).numpy()  # numpy has no bfloat16
