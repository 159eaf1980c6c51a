"""Prefix-tree packing for the policy update: what a prompt's samples share is computed once.

The n rollouts of a prompt begin with the same prompt tokens (in the default job 59 of ~105), and often
with the same first turn too: the same tool call, hence the same tool result (in the default job's middle
steps 6-8 of a prompt's 8 rollouts). An update over separate rows computes all of that n times, forward
and backward. A `Pack` lays samples that share a key (a prompt) out as one row holding their prefix
tree: sorted by token ids, each sample adds only the tokens past its longest common prefix with the one
before it, every token at the position it has in its own sequence. The attention mask lets a token see
exactly its ancestors in the tree (its own sequence's earlier tokens), so every token's hidden state,
and with it its log-prob, is the one its own row gives (float rounding apart: 2e-5 on the tiny model),
and a shared token's gradient is the sum over the samples that contain it, as with separate rows.
Prefix Grouper (Liu et al., 2025) shares the prompt this way for GRPO; this shares the whole tree, and
works for any samples with common prefixes (an augmenter's views of one trajectory share everything
up to their cut).

Where it departs from plain rows: the mask is dense over the pack, so attention costs the square of
the pack's width instead of the sum of its samples' squares. A pack therefore takes another sample only
while that costs less than a row of its own, with the attention-to-linear cost ratio read from the
model's shape (`attention_cost_ratio`).

It needs an attention implementation that takes a 4-D mask (sdpa, eager) and a model whose
positions come from `position_ids`; `Policy.can_pack` compares packed and plain log-probs of one small
pack once per model, and the update falls back to plain rows where they differ.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Hashable, Sequence

import torch

# A sample sharing fewer leading tokens with the pack's previous one starts a row of its own: too little saved.
MIN_SHARED_PREFIX = 8
# What a 4-D mask must look like for each attention implementation that accepts one.
MASK_KINDS = {"sdpa": "bool", "eager": "additive"}


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
    """Samples (anything with `token_ids`), sorted by their ids, laid out as one row of their prefix tree.

    `shared[i]` is how many leading tokens sample i shares with sample i - 1 (0 for the first): sample i
    adds only its tokens past those, and reads the rest where sample i - 1's path has them.
    """

    samples: list
    shared: list[int]

    @property
    def width(self) -> int:
        return sum(len(s.token_ids) - k for s, k in zip(self.samples, self.shared))


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
    """Packs of the samples that share a key (a prompt), keys in order of first appearance.

    Within a key, samples are sorted by token ids (neighbours then share the most), and each joins the
    current pack while it shares at least `MIN_SHARED_PREFIX` tokens with the one before it, what it adds
    costs less than a row of its own (a row of width w costs w + `ratio` * w**2: linear work plus dense
    attention), and the pack stays within `max_width`.
    """
    groups: dict[Hashable, list] = {}
    for sample, key in zip(samples, keys):
        groups.setdefault(key, []).append(sample)
    packs: list[Pack] = []
    for group in groups.values():
        current: Pack | None = None
        for s in sorted(group, key=lambda x: x.token_ids):
            n = len(s.token_ids)
            if current is not None:
                shared = shared_prefix_len([current.samples[-1].token_ids, s.token_ids])
                width, own = current.width, n - shared
                joins = (shared >= MIN_SHARED_PREFIX and own + ratio * (2 * width * own + own * own) < n + ratio * n * n
                         and (max_width is None or width + own <= max_width))
                if joins:
                    current.samples.append(s)
                    current.shared.append(shared)
                    continue
                packs.append(current)
            current = Pack([s], [0])
        packs.append(current)
    return packs


def pack_inputs(packs: list[Pack], pad_id: int, device: torch.device, mask_kind: str,
                dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    """The forward's tensors for `packs` (rows = packs), and where each sample's tokens landed.

    Returns input_ids, position_ids [R, W], attention_mask [R, 1, W, W] (bool, or additive in `dtype` for
    `mask_kind="additive"`) and index [B, T]: for sample b (the packs' samples in order) and its token t,
    the flat position (row * W + column) of that token in the packed rows; columns past a sample's end
    point at its row's first token.
    """
    rows, width = len(packs), max(p.width for p in packs)
    samples = [s for p in packs for s in p.samples]
    longest = max(len(s.token_ids) for s in samples)
    ids = torch.full((rows, width), pad_id, dtype=torch.long)
    pos = torch.zeros((rows, width), dtype=torch.long)
    # on_path[r, i, c]: column c of row r is a token of the row's sample i (its own, or shared before it)
    on_path = torch.zeros((rows, max(len(p.samples) for p in packs) + 1, width), dtype=torch.bool)
    owner = torch.full((rows, width), -1, dtype=torch.long)  # the sample whose own tokens a column holds
    index = torch.zeros((len(samples), longest), dtype=torch.long)
    b = 0
    for r, pack in enumerate(packs):
        at, path = 0, torch.zeros(0, dtype=torch.long)
        for i, (s, shared) in enumerate(zip(pack.samples, pack.shared)):
            n = len(s.token_ids)
            ids[r, at:n - shared + at] = torch.tensor(s.token_ids[shared:], dtype=torch.long)
            pos[r, at:n - shared + at] = torch.arange(shared, n)
            owner[r, at:n - shared + at] = i
            path = torch.cat([path[:shared], torch.arange(at, at + n - shared)])  # column of each of its tokens
            on_path[r, i, path] = True
            index[b, :n] = r * width + path
            index[b, n:] = r * width
            at += n - shared
            b += 1
    # A token sees the earlier tokens of its own sample's path: its ancestors in the tree. Padding (owner
    # -1: the extra all-False path) sees only itself, so no row of the mask is empty (sdpa gives NaN there).
    who = torch.where(owner >= 0, owner, on_path.shape[1] - 1)
    mask = on_path[torch.arange(rows)[:, None], who] & (pos[:, None, :] <= pos[:, :, None])  # [R, query, key]
    mask |= torch.eye(width, dtype=torch.bool)[None] & (owner < 0)[:, :, None]
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
