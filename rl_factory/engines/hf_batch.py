"""The embedded engine's running batch and its requests (rl_factory/engines/hf.py runs them).

A `_Request` is one generation waiting for its future; the `_Batch` holds the running rows (row i in KV
slot i), joins arrivals between decode steps (prefill, with cached prefixes), samples one token per row per
step and resolves each row's future when it stops, with the run guard's receipt and, under async training,
which policy version sampled which tokens.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from rl_factory.engines.base import Generation, SamplingParams, version_spans
from rl_factory.engines.kv import KVSlots, PrefixStore, attention_masks, min_rows, slot_bytes
from rl_factory.engines.prefill import prefill_runs
from rl_factory.engines.sampling import sample_rows, uniforms
from rl_factory.guard.fingerprint import adapter_key
from rl_factory.guard.evidence import receipt
from rl_factory.lora import trunk

if TYPE_CHECKING:
    from rl_factory.engines.hf import HFEngine

RAGGED_ATTENTION = "rl_factory_ragged"


@dataclass
class _Request:
    prompt_ids: list[int]
    params: SamplingParams
    future: asyncio.Future = field(repr=False)
    loop: asyncio.AbstractEventLoop = field(repr=False)
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    uniforms: torch.Tensor | None = field(default=None, repr=False)  # one draw per token to sample
    version: int | None = None  # the policy version of the weights that prefilled it (None: not tracked)
    switches: list[tuple[int, int]] = field(default_factory=list)  # (token index, version) of each swap
    adapters: tuple | None = None  # a LoRA adapter state other than the synced one that a forward of it ran with

    def resolve(self, result: Any = None, error: BaseException | None = None) -> None:
        resolve_all([(self, result, error)])

    def settle(self, result: Any, error: BaseException | None) -> None:
        if not self.future.done():
            self.future.set_exception(error) if error else self.future.set_result(result)


def resolve_all(outcomes: list[tuple[_Request, Any, BaseException | None]]) -> None:
    """Hand results to their callers' event loops: one wake-up per loop, not per request (each wake-up
    writes to the loop's self-pipe; a rollout retires ~250 requests)."""
    by_loop: dict[asyncio.AbstractEventLoop, list] = {}
    for req, result, error in outcomes:
        by_loop.setdefault(req.loop, []).append((req, result, error))
    for loop, items in by_loop.items():
        loop.call_soon_threadsafe(lambda items=items: [req.settle(result, error) for req, result, error in items])


class _Batch:
    """The running batch: its rows (row i lives in KV slot i) and each row's next-token logits."""

    def __init__(self, engine: HFEngine, prefixes: PrefixStore | None = None):
        self.e = engine
        self.model = engine.model
        self.device = next(self.model.parameters()).device
        self.rows: list[_Request] = []
        self.min_rows = min_rows()
        max_rows = max(engine.max_batch_size, self.min_rows)
        size = slot_bytes(self.model, max_rows, engine.max_context)
        full = engine.max_context if size is not None and size <= engine.kv_prealloc_bytes else 0
        self.kv = KVSlots(self.device, max_rows=max_rows, full_positions=full)
        self.logits: torch.Tensor | None = None  # [len(rows), V]
        self.deviant: tuple | None = None  # the adapter state of a forward that ran unlike the synced one
        self.prefixes = prefixes or PrefixStore(self.model)
        self.head = self.model.get_output_embeddings()
        self.body = trunk(self.model)  # the transformer without its LM head (under LoRA: the adapted one)
        self.softcap = getattr(self.model.config, "final_logit_softcapping", None)
        layer_types = getattr(self.model.config, "layer_types", None) or []
        self.sliding_window = self.model.config.sliding_window if "sliding_attention" in layer_types else None

    def _forward(self, ids: torch.Tensor, positions: torch.Tensor, start: int, last: torch.Tensor) -> torch.Tensor:
        """Run `ids` [R, Q] at `positions` [R, Q] for the rows in slots start..start+R-1, writing their
        keys/values there; returns the logits [R, V] at query index `last` [R] of each row."""
        width = self.kv.width(int(positions.max()) + 1)
        masks = attention_masks(positions, width, self.sliding_window)
        config, was_training = self.model.config, self.model.training
        # The trainer's forwards keep the model's own attention; only the engine's use the slots.
        attention = config._attn_implementation
        config._attn_implementation = RAGGED_ATTENTION
        # The trainer leaves the model in eval mode between updates, and `Module.train()` walks every
        # submodule (134 attribute sets per forward of the tiny model), so the mode changes only when it must.
        if was_training:
            self.model.eval()
        try:
            layers, synced = self.e.adapter_state
            if layers:  # what the adapter layers compute with, read where they compute (run guard's receipts)
                now = adapter_key(layers)
                if now != synced:
                    self.deviant = now
            out = self.body(input_ids=ids, position_ids=positions, use_cache=True, attention_mask=masks,
                            past_key_values=self.kv.writer(start, len(ids), positions, width))
        finally:
            config._attn_implementation = attention
            if was_training:
                self.model.train()
        hidden = out.last_hidden_state[torch.arange(len(ids), device=self.device), last]
        return self._logits(hidden)

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        rows = len(hidden)
        if rows < self.min_rows:  # the LM head's matmul must see enough rows (batch-invariant kernels)
            hidden = torch.cat([hidden, hidden[:1].expand(self.min_rows - rows, -1)])
        logits = self.head(hidden)[:rows].float()
        if self.softcap:  # Gemma-style final logit soft-capping
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits

    def join(self, reqs: list[_Request]) -> None:
        """Prefill new requests (only what no kept cache covers) and add them to the batch.

        Identical prompts (the n rollouts of one prompt) are prefilled once and copied. The rest go shortest
        first, in runs of similar length each padded to its own longest (`prefill_runs`): one long observation
        (a parse error's ~85 tokens beside ~20) had padded all 32 rows of its join, 3.9x the tokens.
        """
        e = self.e
        e.stats["batches"] += 1
        e.stats["rows"] += len(reqs)
        for r in reqs:
            r.uniforms = uniforms(r.params)
        groups: dict[tuple[int, ...], list[_Request]] = {}
        for r in reqs:
            groups.setdefault(tuple(r.prompt_ids), []).append(r)
        first, unique = len(self.rows), len(groups)
        self.kv.reserve(first + len(reqs), 0)
        hits = [self.prefixes.take(key) if e.prefix_cache else None for key in groups]
        need = [len(key) - (hit[0] if hit is not None else 0) for key, hit in zip(groups, hits)]
        order = sorted(range(unique), key=need.__getitem__)  # slot first + i holds the i-th shortest
        keys, members = list(groups), list(groups.values())
        keys, members, hits = [keys[i] for i in order], [members[i] for i in order], [hits[i] for i in order]
        starts = [self.kv.load(slot, hit) if hit is not None else 0 for slot, hit in enumerate(hits, start=first)]
        suffixes = [key[s:] for key, s in zip(keys, starts)]
        e.stats["prefill_tokens"] += sum(len(s) for s in suffixes)
        e.stats["reused_tokens"] += sum(starts)
        parts = []
        for a, b in prefill_runs([len(s) for s in suffixes], self.min_rows):
            # enough query tokens for batch-invariant kernels (padding queries write scratch positions)
            width = max(len(suffixes[b - 1]), 4, -(-self.min_rows // (b - a)))
            ids = torch.full((b - a, width), e.pad_token_id, dtype=torch.long)
            for i, suffix in enumerate(suffixes[a:b]):
                ids[i, :len(suffix)] = torch.tensor(suffix, dtype=torch.long)
            start = torch.tensor(starts[a:b], dtype=torch.long)
            positions = start[:, None] + torch.arange(width)[None, :]
            last = torch.tensor([len(suffix) - 1 for suffix in suffixes[a:b]])
            e.stats["prefill_padded_tokens"] += ids.numel()
            e.stats["prefill_forwards"] += 1
            parts.append(self._forward(ids.to(self.device), positions.to(self.device), first + a, last.to(self.device)))
            self.kv.lengths[first + a:first + b] = start + last + 1
        logits = torch.cat(parts) if len(parts) > 1 else parts[0]
        # Slots: the unique prompts first, then a copy of its twin's slot for every duplicate.
        twins = [(first + i, r) for i, group in enumerate(members) for r in group[1:]]
        if twins:
            self.kv.copy([s for s, _ in twins], list(range(first + unique, first + unique + len(twins))))
            logits = torch.cat([logits, logits[torch.tensor([s - first for s, _ in twins], device=self.device)]])
        self.rows += [group[0] for group in members] + [r for _, r in twins]
        self.logits = logits if first == 0 else torch.cat([self.logits, logits])
        self._mark(reqs)

    def _mark(self, rows: list[_Request]) -> None:
        """Rows whose logits a forward computed with another adapter state than the synced one keep it."""
        if self.deviant is not None:
            for req in rows:
                req.adapters = req.adapters or self.deviant
            self.deviant = None

    def step(self) -> None:
        """Sample one token for every row, retire finished rows, and run the next forward."""
        counters = self.e.counters
        counters["decode_steps"] += 1
        counters["row_steps"] += len(self.rows)
        self.e.max_rows = max(self.e.max_rows, len(self.rows))
        tokens, logprobs = sample_rows(self.logits, self.rows)
        done, stopped = [], []
        for i, (req, tok, lp) in enumerate(zip(self.rows, tokens.tolist(), logprobs.tolist())):
            req.ids.append(tok)
            req.logprobs.append(lp)
            counters["tokens"] += 1
            if tok == self.e.eos_token_id:
                stopped.append(i)
                done.append(i)
            elif len(req.ids) >= req.params.max_new_tokens:
                done.append(i)
        if stopped and self.e.prefix_cache:  # each trajectory's next turn starts with exactly these ids
            for i, cache in zip(stopped, self.kv.save(stopped)):
                self.prefixes.put(tuple(self.rows[i].prompt_ids + self.rows[i].ids), cache)
        if done:
            eos = set(stopped)
            e = self.e
            resolve_all([(self.rows[i], Generation(self.rows[i].ids, self.rows[i].logprobs, "stop" if i in eos else
                                                   "length", receipt(self.rows[i].ids, e.version, e.weights if
                                                                     self.rows[i].adapters is None else
                                                                     e.weights_with(self.rows[i].adapters)),
                                                   version_spans(self.rows[i].version, self.rows[i].switches,
                                                                 len(self.rows[i].ids))), None)
                         for i in done])
            order = self.kv.remove(done, len(self.rows))  # live rows moved into the freed slots
            self.rows = [self.rows[i] for i in order]
            tokens = tokens[torch.tensor(order, dtype=torch.long, device=tokens.device)]
        if not self.rows:
            self.logits = None
            return
        # One token per row; spare slots pad the forward to min_rows rows (their output is dropped).
        live, n = len(self.rows), max(len(self.rows), self.min_rows)
        self.kv.reserve(n, 0)
        ids = torch.full((n, 1), self.e.pad_token_id, dtype=torch.long, device=self.device)
        ids[:live, 0] = tokens
        # Spare slots keep the lengths of rows that left; at position 0 their scratch queries do not widen
        # the attention of the live rows (a lone tail row of 150 tokens beside a stale 300 attended over 320).
        positions = torch.zeros((n, 1), dtype=torch.long)
        positions[:live, 0] = self.kv.lengths[:live]
        positions = positions.to(self.device)
        last = torch.zeros(n, dtype=torch.long, device=self.device)
        self.logits = self._forward(ids, positions, 0, last)[:live]
        self.kv.lengths[:live] += 1
        self._mark(self.rows)

    def fail(self, exc: BaseException, extra: list[_Request] = ()) -> None:
        for req in [*self.rows, *extra]:
            req.resolve(error=exc)
        self.rows = []
