"""Shared-prefix packing for the policy update: a prompt's samples computed with the prompt once.

The n rollouts of a prompt begin with the same prompt tokens (in the default job 59 of ~105 tokens),
and an update over separate rows computes that prompt n times, forward and backward. A `Pack` lays
samples that share a prefix out as one row: the prefix once, then each sample's own continuation at
the positions it has in its own sequence (position ids restart after the prefix for each one). The
attention mask lets a continuation see the prefix and itself only, causally, so every token's hidden
state, and with it its log-prob, is the one its own sequence gives (float rounding apart: 4e-6 on the
tiny model), and the gradient that reaches the prefix is the sum over its continuations, as with
separate rows. Prefix Grouper (Liu et al., 2025) does the same for GRPO; this is that idea for any
samples with a common prefix (a prompt's rollouts, an augmenter's views of one trajectory).

Where it departs from plain rows: the mask is dense over the pack, so attention costs the square of
the pack's width instead of the sum of its samples' squares. A pack therefore takes another
continuation only while that costs less than a row of its own with a copy of the prefix, with the
attention-to-linear cost ratio read from the model's shape (`attention_cost_ratio`): on the tiny
model a prompt's 8 rollouts pack into one row of ~430 tokens instead of 8 of ~105.

It needs an attention implementation that takes a 4-D mask (sdpa, eager) and a model whose
positions come from `position_ids`; `Policy.can_pack` compares packed and plain log-probs of one small
pack once per model, and the update falls back to plain rows where they differ.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Hashable, Sequence

import torch

# Shorter shared prefixes are not worth a pack: each sample keeps a row of its own.
MIN_SHARED_PREFIX = 8
# What a 4-D mask must look like for each attention implementation that accepts one.
MASK_KINDS = {"sdpa": "bool", "eager": "additive"}
_PREFIX, _PAD = -1, -2  # segment ids of the shared prefix and of padding in a packed row


def shared_prefix_len(seqs: Sequence[Sequence[int]]) -> int:
    """Length of the longest prefix common to every sequence."""
    first, n = seqs[0], min(len(s) for s in seqs)
    for i in range(n):
        token = first[i]
        if any(s[i] != token for s in seqs[1:]):
            return i
    return n


@dataclass
class Pack:
    """Samples (anything with `token_ids`) that share their first `prefix` tokens, laid out as one row."""

    samples: list
    prefix: int

    @property
    def width(self) -> int:
        return self.prefix + sum(len(s.token_ids) - self.prefix for s in self.samples)


def attention_cost_ratio(config: Any, num_params: int) -> float:
    """FLOPs of one (query, key) pair of attention over one token's FLOPs in the linear layers, model-wide.

    Attention multiplies a query by a key and a value per head (4 * heads * head_dim FLOPs per layer);
    the linear layers and the LM head cost ~2 FLOPs per parameter per token. 1.2e-3 for the tiny model.
    """
    heads = getattr(config, "num_attention_heads", None)
    layers = getattr(config, "num_hidden_layers", None)
    if not heads or not layers or not num_params:
        return 0.0
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return 4 * heads * head_dim * layers / (2 * num_params)


def build_packs(samples: list, keys: list[Hashable], ratio: float, max_width: int | None = None) -> list[Pack]:
    """Packs of the samples that share a key (a prompt), in order of first appearance.

    A group whose common prefix is shorter than `MIN_SHARED_PREFIX` gives a pack per sample. Otherwise
    continuations join the current pack while that costs less than a row of their own (width + `ratio` *
    width**2 for a row: linear work plus dense attention) and the pack stays within `max_width`.
    """
    groups: dict[Hashable, list] = {}
    for sample, key in zip(samples, keys):
        groups.setdefault(key, []).append(sample)
    packs: list[Pack] = []
    for group in groups.values():
        prefix = shared_prefix_len([s.token_ids for s in group]) if len(group) > 1 else 0
        if prefix < MIN_SHARED_PREFIX:
            packs += [Pack([s], len(s.token_ids)) for s in group]
            continue
        current = Pack([], prefix)
        for s in group:
            own = len(s.token_ids) - prefix
            width = current.width
            alone = prefix + own + ratio * (prefix + own) ** 2
            joins = own + ratio * (2 * width * own + own * own) < alone
            if current.samples and (not joins or (max_width is not None and width + own > max_width)):
                packs.append(current)
                current = Pack([], prefix)
            current.samples.append(s)
        packs.append(current)
    return packs


def pack_inputs(packs: list[Pack], pad_id: int, device: torch.device, mask_kind: str,
                dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    """The forward's tensors for `packs` (rows = packs), and where each sample's tokens landed.

    Returns input_ids, position_ids [R, W], attention_mask [R, 1, W, W] (bool, or additive in `dtype` for
    `mask_kind="additive"`) and index [B, T]: for sample b (packs' samples in order) and its token t, the
    flat position (row * W + column) of that token in the packed rows; columns past a sample's end point
    at its row's first token.
    """
    rows, width = len(packs), max(p.width for p in packs)
    samples = [s for p in packs for s in p.samples]
    longest = max(len(s.token_ids) for s in samples)
    ids = torch.full((rows, width), pad_id, dtype=torch.long)
    pos = torch.zeros((rows, width), dtype=torch.long)
    seg = torch.full((rows, width), _PAD, dtype=torch.long)
    index = torch.zeros((len(samples), longest), dtype=torch.long)
    b = 0
    for r, pack in enumerate(packs):
        p, base = pack.prefix, r * width
        ids[r, :p] = torch.tensor(pack.samples[0].token_ids[:p], dtype=torch.long)
        pos[r, :p] = torch.arange(p)
        seg[r, :p] = _PREFIX
        at = p
        for i, s in enumerate(pack.samples):
            n = len(s.token_ids) - p
            ids[r, at:at + n] = torch.tensor(s.token_ids[p:], dtype=torch.long)
            pos[r, at:at + n] = torch.arange(p, p + n)
            seg[r, at:at + n] = i
            index[b, :p] = base + torch.arange(p)
            index[b, p:p + n] = base + at + torch.arange(n)
            index[b, p + n:] = base
            at += n
            b += 1
    # A token sees the earlier positions of the prefix and of its own segment. Padding (position 0)
    # sees the row's first token and other padding, so no row of the mask is empty (sdpa gives NaN there).
    keys, queries = seg[:, None, :], seg[:, :, None]
    mask = (pos[:, None, :] <= pos[:, :, None]) & ((keys == _PREFIX) | (keys == queries))
    mask = mask[:, None]
    if mask_kind == "additive":
        mask = torch.zeros(mask.shape, dtype=dtype).masked_fill_(~mask, torch.finfo(dtype).min)
    return {"input_ids": ids.to(device), "position_ids": pos.to(device), "attention_mask": mask.to(device),
            "index": index.to(device)}


def gather_logprobs(logits: torch.Tensor, index: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """[B, T] log-probs of each sample's tokens from the packed logits [R, W, V] (column 0 is 0).

    Token t of sample b is predicted at the packed position of its token t - 1.
    """
    logprobs = torch.log_softmax(logits.float(), dim=-1).flatten(0, 1)
    picked = logprobs[index[:, :-1], targets[:, 1:]]
    return torch.cat([torch.zeros_like(picked[:, :1]), picked], dim=1)
