"""Padding-free attention without flash-attn: `attn_implementation="rl_factory_varlen"`.

verl's FSDP actor with `use_remove_padding` packs a micro-batch into one row of `total_tokens` and
marks where each sequence starts only through `position_ids` (they restart at 0). transformers'
`flash_attention_2` reads that and runs FlashAttention's varlen kernel; without the flash-attn
package the usual fallback, `sdpa`, builds a dense block-diagonal mask of total_tokens^2 and attends
over the whole packed row: correct, but the attention work grows with the square of the micro-batch
instead of the sum of squares of its sequences (measured: the actor update at a few percent of the
GPU's forward+backward rate).

This module gives transformers a third way: PyTorch's own FlashAttention varlen kernel
(`torch.nn.attention.varlen.varlen_attn`, in every CUDA build of torch >= 2.10), fed with the
sequence boundaries read from `position_ids` (packed rows) or from the padding mask (padded batches,
unpadded here first). Importing the module registers the name with transformers
(`AttentionInterface` for the kernel, `AttentionMaskInterface` so that the padding mask, not a dense
4-D one, reaches it). The verl launcher names this module in `actor_rollout_ref.model.external_lib`,
which verl imports in every worker before it builds the model.

Where the kernel cannot run (a CPU tensor, a torch without `varlen_attn`) each sequence goes through
`scaled_dot_product_attention` on its own: the same result, slower; used by the CPU tests.
"""
from __future__ import annotations

import inspect
import weakref
from typing import Any

import torch
import torch.nn.functional as F

NAME = "rl_factory_varlen"

try:  # torch >= 2.10 (CUDA builds run it; on CPU we take the per-sequence path)
    from torch.nn.attention.varlen import varlen_attn as _varlen_attn
    _VARLEN_PARAMS = set(inspect.signature(_varlen_attn).parameters)
except ImportError:  # pragma: no cover - older torch
    _varlen_attn, _VARLEN_PARAMS = None, set()


def boundaries(position_ids: torch.Tensor | None, attention_mask: torch.Tensor | None, batch: int,
               seq_len: int, device: torch.device) -> tuple[torch.Tensor | None, torch.Tensor, int]:
    """(token indices to keep or None for all, cu_seqlens int32, max sequence length) of a batch.

    A packed row (batch 1, no mask) is cut where a position does not follow its predecessor, as
    transformers' `find_packed_sequence_indices` does; a padded batch keeps the tokens its mask marks.
    """
    if attention_mask is not None and attention_mask.dim() == 2 and not bool(attention_mask.all()):
        keep = attention_mask.bool()
        lengths = keep.sum(dim=1, dtype=torch.int32)
        indices = keep.flatten().nonzero(as_tuple=True)[0]
    elif batch == 1 and position_ids is not None:
        pos = position_ids.reshape(-1)[-seq_len:]
        starts = torch.ones_like(pos, dtype=torch.bool)
        starts[1:] = pos[1:] != pos[:-1] + 1
        first = starts.nonzero(as_tuple=True)[0]
        lengths = torch.diff(first, append=first.new_tensor([seq_len])).to(torch.int32)
        indices = None
    else:
        lengths, indices = torch.full((batch,), seq_len, dtype=torch.int32, device=device), None
    cu = F.pad(torch.cumsum(lengths, 0, dtype=torch.int32), (1, 0)).to(device)
    return indices, cu, int(lengths.max().item())


# Every layer of one forward sees the same position_ids / mask tensor: work out the boundaries once
# (each costs a device sync). Held by weak reference, so a freed tensor's address is never mistaken
# for the next micro-batch's.
_last: tuple[Any, Any, tuple] | None = None


def _cached_boundaries(position_ids, attention_mask, batch, seq_len, device):
    global _last
    if _last is not None and _last[0]() is position_ids and _last[1]() is attention_mask:
        return _last[2]
    result = boundaries(position_ids, attention_mask, batch, seq_len, device)
    ref = lambda t: weakref.ref(t) if t is not None else (lambda: None)  # noqa: E731
    _last = (ref(position_ids), ref(attention_mask), result)
    return result


def _per_sequence(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu: torch.Tensor, scale: float | None,
                  window: int | None) -> torch.Tensor:
    """Reference path: each sequence through SDPA on its own (tokens, heads, dim) -> same layout."""
    out = torch.empty_like(q)
    groups = q.shape[1] // k.shape[1]
    bounds = cu.tolist()
    for start, end in zip(bounds[:-1], bounds[1:]):
        if end == start:
            continue
        qs, ks, vs = (t[start:end].transpose(0, 1) for t in (q, k, v))
        if groups > 1:
            ks, vs = ks.repeat_interleave(groups, 0), vs.repeat_interleave(groups, 0)
        n = end - start
        mask = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
        if window is not None:
            mask &= ~torch.ones(n, n, dtype=torch.bool, device=q.device).tril(-window)
        out[start:end] = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask, scale=scale).transpose(0, 1)
    return out


def _kernel(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu: torch.Tensor, max_len: int,
            scale: float | None, window: int | None) -> torch.Tensor:
    kwargs: dict[str, Any] = {"scale": scale}
    if "window_size" in _VARLEN_PARAMS:  # torch >= 2.11: (-1, 0) is causal
        kwargs["window_size"] = (window - 1 if window else -1, 0)
    else:  # torch 2.10
        if window:
            raise ValueError("sliding-window attention needs torch >= 2.11 for rl_factory_varlen")
        kwargs["is_causal"] = True
    if q.shape[1] != k.shape[1]:
        if "enable_gqa" in _VARLEN_PARAMS:
            kwargs["enable_gqa"] = True
        else:
            groups = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
    return _varlen_attn(q, k, v, cu, cu, max_len, max_len, **kwargs)


def kernel_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype the FlashAttention kernel computes in: it takes fp16/bf16 only. fp32 q/k/v arrive from an fp32
    model, or under bf16 autocast once RoPE's fp32 cos/sin promote them; cast as transformers' flash_attention_2
    does: to the autocast dtype, else bf16 (the output returns in the caller's dtype)."""
    if dtype in (torch.float16, torch.bfloat16):
        return dtype
    return torch.get_autocast_dtype("cuda") if torch.is_autocast_enabled("cuda") else torch.bfloat16


def varlen_attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                             value: torch.Tensor, attention_mask: torch.Tensor | None, scaling: float | None = None,
                             dropout: float = 0.0, sliding_window: int | None = None,
                             position_ids: torch.Tensor | None = None, **_: Any) -> tuple[torch.Tensor, None]:
    """transformers' attention-function contract: (batch, heads, seq, dim) in, (batch, seq, heads, dim) out."""
    if dropout and module.training:
        raise ValueError(f"{NAME} has no attention dropout (got {dropout}); RL fine-tuning runs without it")
    batch, heads, seq_len, dim = query.shape
    indices, cu, max_len = _cached_boundaries(position_ids, attention_mask, batch, seq_len, query.device)
    q, k, v = (t.transpose(1, 2).reshape(batch * seq_len, t.shape[1], dim) for t in (query, key, value))
    if indices is not None:
        q, k, v = q[indices], k[indices], v[indices]
    use_kernel = _varlen_attn is not None and query.is_cuda
    if use_kernel:
        half = kernel_dtype(q.dtype)
        out = _kernel(q.to(half), k.to(half), v.to(half), cu, max_len, scaling, sliding_window).to(query.dtype)
    else:
        out = _per_sequence(q, k, v, cu, scaling, sliding_window)
    if indices is not None:
        full = out.new_zeros(batch * seq_len, heads, dim)
        full[indices] = out
        out = full
    return out.reshape(batch, seq_len, heads, dim), None


def register() -> None:
    """Make `attn_implementation="rl_factory_varlen"` known to transformers in this process."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask

    AttentionInterface.register(NAME, varlen_attention_forward)
    # The flash-attention mask is the 2-D padding mask (or None): exactly what `boundaries` reads.
    AttentionMaskInterface.register(NAME, flash_attention_mask)


register()
