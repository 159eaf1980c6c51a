"""The embedded engine's key/value storage: ragged slots, and caches kept for a trajectory's next turn.

Row i of the running batch lives in slot i. Per layer, keys and values are buffers
[slots, kv_heads, capacity, head_dim]; a row keeps its tokens at positions 0..len-1 and the rest of
its slot is scratch (masked). A forward attends over the first `width` positions, a multiple of
`KV_BLOCK`, so a row's attention never depends on how long its neighbours are.

`KVSlots.writer(...)` is what the model receives as `past_key_values`: transformers' attention
layers call `update(keys, values, layer_idx)` and attend to what it returns, so writing each row's
new keys at its own positions is all it takes (the mask comes in precomputed).
"""
from __future__ import annotations

import torch

# Attention spans whole blocks of positions, and its values are summed one block at a time: a row's
# attention is then the same bits for any width that is a multiple of this (tests/engines/test_kv.py).
KV_BLOCK = 64


def min_rows() -> int:
    """Rows (or query tokens) a forward must have for BLAS to use the same kernel on every row.

    MKL computes a few rows with other kernels than many, and splits rows across threads in chunks
    whose tail may be that small. How few depends on the CPU: on one Xeon fewer than 4 rows of any
    shape; on an AVX-512 Xeon (torch 2.13, one thread) fewer than 16 rows once a matmul sums over
    384 or more (the tiny model's MLP down-projection: 15 row counts gave other bits), fewer than 6 for
    128. From 16 rows per thread up, each row's result is the same bits whatever the batch size on
    both (tests/engines/test_hf_engine.py). Below it, the engine pads the batch with scratch rows.
    """
    return 16 * max(1, torch.get_num_threads())


def attention_masks(positions: torch.Tensor, width: int, sliding_window: int | None = None) -> dict:
    """Additive masks [R, 1, Q, width] per layer type: the query at position p sees keys 0..p of its
    own row (the last `sliding_window` of them in sliding-attention layers)."""
    keys = torch.arange(width, device=positions.device)[None, None, None, :]
    query = positions[:, None, :, None]
    seen = keys <= query
    masks = {"full_attention": _additive(seen)}
    if sliding_window:
        masks["sliding_attention"] = _additive(seen & (keys > query - sliding_window))
    return masks


def _additive(allowed: torch.Tensor) -> torch.Tensor:
    return torch.zeros(allowed.shape, device=allowed.device).masked_fill_(~allowed, float("-inf"))


def ragged_attention(module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     attention_mask: torch.Tensor, scaling: float | None = None, dropout: float = 0.0, **_):
    """Attention over the slots' keys, as transformers' attention interface calls it.

    query [R, Hq, Q, D]; key/value [R, Hkv, width, D] (views into the slot buffers); the mask is
    additive [R, 1, Q, width]. Returns [R, Q, Hq, D]. The grouped query heads are reshaped onto
    their shared key/value head (no copy of the cache per query head); the values are summed
    over the keys one KV_BLOCK at a time, so a row's bits do not depend on the width (the longest
    row's). On CPU this path is always taken:
    torch's fused CPU attention splits queries into blocks whose last one may be small enough to
    switch kernels, which would make a row's bits depend on its neighbours' lengths. Elsewhere
    (GPU, no bit-for-bit promise) prefill uses the fused kernel.
    """
    rows, heads, q_len, dim = query.shape
    kv_heads = key.shape[1]
    group = heads // kv_heads
    scale = scaling if scaling is not None else dim ** -0.5
    if q_len > 1 and query.device.type != "cpu":
        key = key[:, :, None].expand(rows, kv_heads, group, *key.shape[2:]).reshape(rows, heads, *key.shape[2:])
        value = value[:, :, None].expand(rows, kv_heads, group, *value.shape[2:]).reshape(rows, heads, *value.shape[2:])
        out = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask,
                                                               scale=scale)
        return out.transpose(1, 2).contiguous(), None
    q = query.reshape(rows, kv_heads, group * q_len, dim)
    scores = torch.matmul(q, key.transpose(-1, -2)) * scale  # [R, Hkv, group * Q, width]
    scores = (scores.view(rows, kv_heads, group, q_len, -1) + attention_mask[:, :, None]).view(
        rows, kv_heads, group * q_len, -1)
    probs = torch.softmax(scores.float(), dim=-1).to(value.dtype)
    # BLAS sums the product over the keys in blocks of its own choosing, which change with the width: a row
    # prefilled after a kept cache got other bits at width 256 than at 192 or 320 (59 of 150 random prefill
    # shapes depended on the width), and on an AVX-512 Xeon a decode step at position 300 got other bits at
    # width 448 than at 320 (none of 400 decode shapes had on the machine before). Summed KV_BLOCK keys at a
    # time, in order, the blocks past a query's position add exact zeros, so the width cannot matter.
    out = torch.matmul(probs[..., :KV_BLOCK], value[:, :, :KV_BLOCK])
    for start in range(KV_BLOCK, key.shape[2], KV_BLOCK):
        out = out + torch.matmul(probs[..., start:start + KV_BLOCK], value[:, :, start:start + KV_BLOCK])
    return out.view(rows, heads, q_len, dim).transpose(1, 2).contiguous(), None


class KVSlots:
    """Per-layer key/value buffers for `slots` rows: made whole at the first forward when `full_positions` is
    given, else grown on demand (in rows and in positions)."""

    def __init__(self, device: torch.device, max_rows: int = 0, full_positions: int = 0):
        """`max_rows`: the most rows a forward has (the engine's batch); growth in rows stops there instead of
        doubling past it. `full_positions`: when > 0, the buffers are made that long at once.

        Why at once: growing copies every slot of every layer into freshly allocated memory, and the first
        touch of new pages is the slow part on CPU (2-core VM: 105 MB in 268 ms, ~0.4 GB/s). Grown by
        doubling, the tiny model's buffers went 128 -> 256 -> 512 positions (and 100 -> 200 rows) during the
        first steps of a run, and the last growth fell on whichever step first had a long trajectory: one
        rollout of 0.92 s against 0.36-0.56 s (seed 6, step 6: one 3-turn trajectory of 131 tokens waited
        180 ms for it). Allocated once, at the first forward (the step-0 validation), no step pays.
        """
        self.device = device
        self.max_rows = max_rows
        self.full_positions = full_positions
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.lengths = torch.zeros(0, dtype=torch.long)  # tokens cached per slot (CPU)
        self.allocations = 0  # times the buffers were made: the first forward, then each growth

    @property
    def capacity(self) -> int:
        return self.keys[0].shape[2] if self.keys else 0

    def reserve(self, slots: int, width: int) -> None:
        """Make room for `slots` rows of `width` positions (growing geometrically, copying once)."""
        if slots > len(self.lengths):
            self.lengths = torch.cat([self.lengths, torch.zeros(slots - len(self.lengths), dtype=torch.long)])
        if not self.keys:
            return  # buffers are shaped by the first layer update
        rows, cap = self.keys[0].shape[0], self.capacity
        new_rows = rows if slots <= rows else max(slots, min(2 * rows, self.max_rows or 2 * rows))
        new_cap = cap if width <= cap else _round_up(max(width, 2 * cap), KV_BLOCK)
        if (new_rows, new_cap) != (rows, cap):
            self.allocations += 1
            self.keys = [_grow(k, new_rows, new_cap) for k in self.keys]
            self.values = [_grow(v, new_rows, new_cap) for v in self.values]

    def width(self, needed: int) -> int:
        return _round_up(needed, KV_BLOCK)

    def writer(self, start: int, count: int, positions: torch.Tensor, width: int) -> "_Writer":
        self.reserve(start + count, width)
        return _Writer(self, start, count, positions, width)

    def _layer(self, idx: int, like: torch.Tensor, width: int) -> tuple[torch.Tensor, torch.Tensor]:
        if idx == len(self.keys):  # first forward: shape the buffers after the model's keys
            rows, positions = self._first_shape(width)
            shape = (rows, like.shape[1], positions, like.shape[3])
            self.allocations += idx == 0
            self.keys.append(torch.zeros(shape, dtype=like.dtype, device=like.device))
            self.values.append(torch.zeros(shape, dtype=like.dtype, device=like.device))
        return self.keys[idx], self.values[idx]

    def _first_shape(self, width: int) -> tuple[int, int]:
        rows = max(len(self.lengths), 1, self.max_rows if self.full_positions else 0)
        return rows, _round_up(max(width, self.full_positions), KV_BLOCK)

    def save(self, slots: list[int]) -> list[tuple[int, list[torch.Tensor], list[torch.Tensor]]]:
        """Copies of the slots' cached positions (each kept for its trajectory's next turn).

        One gather per layer for all the slots (a decode step retires many rows at once): copied one slot
        and layer at a time, a rollout of the default job made ~2,000 small copies, 90 ms a step.
        """
        lengths = self.lengths[torch.tensor(slots)].tolist()
        index, n = torch.tensor(slots, device=self.device), max(lengths)
        keys, values = [k[index, :, :n] for k in self.keys], [v[index, :, :n] for v in self.values]  # copies
        return [(m, [k[j, :, :m] for k in keys], [v[j, :, :m] for v in values]) for j, m in enumerate(lengths)]

    def load(self, slot: int, saved: tuple[int, list[torch.Tensor], list[torch.Tensor]]) -> int:
        n, keys, values = saved
        if not self.keys:  # nothing ran yet in this batch: shape the buffers after the saved cache
            rows, positions = self._first_shape(n)
            self.allocations += 1
            self.keys = [torch.zeros((rows, k.shape[0], positions, k.shape[2]), dtype=k.dtype, device=k.device)
                         for k in keys]
            self.values = [torch.zeros_like(k) for k in self.keys]
        self.reserve(slot + 1, n)
        for buf, saved_k in zip(self.keys, keys):
            buf[slot, :, :n] = saved_k
        for buf, saved_v in zip(self.values, values):
            buf[slot, :, :n] = saved_v
        self.lengths[slot] = n
        return n

    def copy(self, src: list[int], dst: list[int]) -> None:
        """Slots `src` into slots `dst`: their cached positions only, not the whole capacity.

        The rest of a slot is scratch that every forward masks out (it adds exact zeros), and copying
        it cost 8x the positions in use: a rollout's twin prompts (16 x 7 slots of 512 positions in the
        default job) took 85 ms of copying a step for ~60 positions each.
        """
        lengths = self.lengths[torch.tensor(src)]
        used = int(lengths.max()) if len(src) else 0
        s, d = torch.tensor(src, device=self.device), torch.tensor(dst, device=self.device)
        for buf in (*self.keys, *self.values):
            view = buf[:, :, :used]
            view.index_copy_(0, d, view.index_select(0, s))
        self.lengths[torch.tensor(dst)] = lengths

    def remove(self, done: list[int], count: int) -> list[int]:
        """Free the slots in `done` (of rows 0..count-1) by moving the last live rows into the holes.

        Returns the old index of the row now in each slot 0..count-len(done)-1.
        """
        gone = set(done)
        live = count - len(done)
        order = list(range(count))
        holes = [i for i in range(live) if i in gone]
        movers = [i for i in range(live, count) if i not in gone]
        if holes:
            self.copy(movers, holes)
            for h, m in zip(holes, movers):
                order[h] = m
        return order[:live]


class _Writer:
    """The `past_key_values` of one forward over slots start..start+count-1."""

    def __init__(self, slots: KVSlots, start: int, count: int, positions: torch.Tensor, width: int):
        self.slots, self.start, self.count, self.width = slots, start, count, width
        self.rows = torch.arange(start, start + count, device=positions.device)[:, None].expand_as(positions)
        self.positions = positions

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        keys, values = self.slots._layer(layer_idx, key_states, self.width)
        # [R, H, Q, D] -> row r's query q is written at position positions[r, q] of slot start + r
        keys[self.rows, :, self.positions] = key_states.transpose(1, 2).to(keys.dtype)
        values[self.rows, :, self.positions] = value_states.transpose(1, 2).to(values.dtype)
        end = self.start + self.count
        return keys[self.start:end, :, :self.width], values[self.start:end, :, :self.width]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.width


class PrefixStore:
    """Caches of stopped rows, keyed by their token ids, for the trajectory's next turn.

    A row that generated eos is kept under prompt + generated ids (its cache covers all of them but
    that last eos). A later request whose prompt starts with those ids loads the cache and prefills
    only the rest. Identical keys hold identical caches (the engine is batch-invariant), so a key
    stored twice is kept once with a count, and each `take` uses one count up: whichever twin
    continues first, both get the same bits. Everything is dropped when the weights change (any
    in-place update bumps a parameter's version counter), since old caches are off-policy.
    """

    def __init__(self, model):
        self.params = list(model.parameters())
        self.version = self._version()
        self.entries: dict[int, dict[tuple[int, ...], list]] = {}  # key length -> key -> [count, cache]

    def _version(self) -> int:
        return sum(p._version for p in self.params)

    def _check_weights(self) -> None:
        version = self._version()
        if version != self.version:
            self.entries.clear()
            self.version = version

    def __len__(self) -> int:
        return sum(len(e) for e in self.entries.values())

    def put(self, key: tuple[int, ...], cache) -> None:
        self._check_weights()
        by_key = self.entries.setdefault(len(key), {})
        if key in by_key:
            by_key[key][0] += 1
        else:
            by_key[key] = [1, cache]

    def take(self, prompt: tuple[int, ...]):
        """The cache of the longest stored key that `prompt` starts with (used up once), or None."""
        self._check_weights()
        for n in sorted(self.entries, reverse=True):
            if n > len(prompt):
                continue
            entry = self.entries[n].get(prompt[:n])
            if entry is not None:
                entry[0] -= 1
                if entry[0] == 0:
                    del self.entries[n][prompt[:n]]
                return entry[1]
        return None


def slot_bytes(model, rows: int, positions: int) -> int | None:
    """Bytes of key/value slots for `rows` x `positions` (an estimate from the config; None if unknown)."""
    cfg = getattr(model, "config", None)
    try:
        layers = cfg.num_hidden_layers
        heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
        dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        item = next(model.parameters()).element_size()
    except (AttributeError, StopIteration, TypeError):
        return None
    return 2 * layers * heads * dim * item * rows * positions


def _round_up(n: int, block: int) -> int:
    return max(block, -(-n // block) * block)


def _grow(buf: torch.Tensor, rows: int, cap: int) -> torch.Tensor:
    out = buf.new_zeros((rows, buf.shape[1], cap, buf.shape[3]))
    out[:buf.shape[0], :, :buf.shape[2]] = buf
    return out
