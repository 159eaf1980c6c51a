"""The embedded engine: a Hugging Face causal LM with continuous batching, on CPU or one GPU.

Rollout tasks call `generate` concurrently. One decode thread keeps a running batch and advances
every row by one token per step; a request that arrives mid-decode is prefilled and joins the
running batch at the next step, and a finished row leaves at once. So a trajectory back from its
tool call never waits for the rest of the batch, and the engine stays busy while tools run.

How it differs from a padded `generate()` loop, and why:

* **Ragged KV slots** (`rl_factory/engines/kv.py`). Each row owns a slot of per-layer key/value
  buffers and keeps its tokens at positions 0..len-1 (right-padded), so a row joins or leaves by
  copying its own slot only; the batch is never re-padded or concatenated as rows come and go.
* **Prefix reuse across turns.** When a row stops, its cache is kept under its token ids; the
  next turn of that trajectory (the same ids plus the tool observation) prefills only the
  observation. Identical prompts arriving together (the n rollouts of one prompt) are prefilled
  once. Kept caches are dropped as soon as the weights change (an optimizer step).
* **Reproducible with any arrival order.** What a row computes never depends on which other rows
  share its batch: sampling draws from the request's own seeded stream (`SamplingParams.seed`,
  inverse-CDF on one uniform per token), and every forward is shaped so that CPU kernels reduce
  each row the same way whatever its neighbours: key lengths are whole multiples of `KV_BLOCK`,
  and a forward has at least `min_rows()` rows and queries (BLAS picks other kernels below). The
  same seeds therefore give the same tokens, log-probs and caches however tool latencies reorder
  the requests. `tests/engines/test_hf_engine.py` checks it bit for bit.

Rows may differ in temperature, top-p and token budget. The log-prob of every sampled token under
softmax(logits / temperature) is recorded (temperature 1 for greedy rows), the quantity the trainer
recomputes. The decode thread runs outside the event loop, so tool calls proceed while the model
computes.
"""
from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from transformers import AttentionInterface

from rl_factory.engines.base import Generation, SamplingParams, register_engine, version_spans
from rl_factory.engines.kv import KVSlots, PrefixStore, attention_masks, min_rows, ragged_attention, slot_bytes
from rl_factory.engines.prefill import prefill_runs
from rl_factory.engines.sampling import sample_rows, uniforms
from rl_factory.guard.evidence import receipt
from rl_factory.lora import trunk

RAGGED_ATTENTION = "rl_factory_ragged"
# Key/value slots up to this size are allocated whole at the first forward (the default job's tiny model:
# 128 rows x 512 positions = 134 MB); bigger ones grow on demand, so a long max_context on a GPU model
# costs only the positions its rows reach.
KV_PREALLOC_BYTES = 1 << 30
AttentionInterface.register(RAGGED_ATTENTION, ragged_attention)


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


@register_engine("hf")
class HFEngine:
    """Continuous-batching generation with a transformers model.

    Args:
        model: a causal LM (its weights are shared with the trainer: generation is on-policy).
        eos_token_id: the end-of-turn token; a row stops after generating it.
        pad_token_id: fills unused query positions.
        max_batch_size: rows decoded together; further requests join as rows finish.
        batch_wait_s: when the engine is idle, how long the first request waits for company before
            prefill (0 is fine: later arrivals join the running batch anyway).
        autocast: context-manager factory for mixed precision (the policy's).
        prefix_cache: keep each stopped row's cache for the trajectory's next turn.
        admit_every: while rows decode, newly arrived requests are prefilled together at most every
            this many decode steps (1 = at once).
        max_context: the most positions a row can need (the rollout's prompt + turns budget). When the
            key/value slots of `max_batch_size` rows that long fit in `kv_prealloc_bytes`, they are
            allocated whole at the first forward instead of grown by doubling mid-rollout (see `KVSlots`);
            0, or slots too big for the budget: grown on demand.
        threads: CPU threads of the decode thread's ops; 0 leaves one of the process's threads free.
            The event loop (parsing, templating, tool I/O) and the tool servers run while the model
            decodes; with every core in the decode's thread team, each small op waits at the team's
            barrier for a thread the OS has given to them (on 2 cores: 6.1 ms a small-batch decode step
            against 2.3 ms with one thread, rollouts 29% shorter). torch's setting is per thread,
            so the trainer's own forwards and backwards keep theirs.
    """

    def __init__(self, model, eos_token_id: int, pad_token_id: int, max_batch_size: int = 64,
                 batch_wait_s: float = 0.002, autocast: Callable[[], Any] = contextlib.nullcontext,
                 prefix_cache: bool = True, admit_every: int = 4, threads: int = 0, max_context: int = 0,
                 kv_prealloc_bytes: int = KV_PREALLOC_BYTES):
        self.model = model
        self.eos_token_id = eos_token_id
        self.pad_token_id = pad_token_id
        self.max_batch_size = max_batch_size
        self.batch_wait_s = batch_wait_s
        self.autocast = autocast
        self.prefix_cache = prefix_cache
        self.admit_every = admit_every
        self.threads = threads or max(1, torch.get_num_threads() - 1)
        self.max_context = max_context
        self.kv_prealloc_bytes = kv_prealloc_bytes
        self._inbox: queue.Queue[_Request | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._batch: _Batch | None = None
        self._lock = threading.Lock()
        # admissions ("batches"), requests admitted ("rows"), prompt tokens prefilled vs. reused from a cache,
        # query tokens the prefill forwards computed (padding included) and how many forwards that took
        self.stats = {"batches": 0, "rows": 0, "prefill_tokens": 0, "reused_tokens": 0, "prefill_padded_tokens": 0,
                      "prefill_forwards": 0}
        self.max_rows = 0  # largest running batch seen (tests check that joins happen mid-decode)
        # The policy version of the weights this engine samples with and their fingerprint: the run guard's
        # receipt (rl_factory/guard). With async training (rl_factory/asynchrony.py) the engine has weights of
        # its own, which the decode thread swaps for new ones between two decode steps (`swap_weights`), and
        # every token span records its version (`tracks_versions`).
        self.version: int | None = None
        self.weights: str | None = None
        self.tracks_versions = False
        self.counters = {"decode_steps": 0, "row_steps": 0, "tokens": 0, "busy_s": 0.0}
        self._swap: tuple[int, Callable[[], None]] | None = None

    def swap_weights(self, version: int, load: Callable[[], None]) -> None:
        """Have the decode thread call `load()` (copy new weights into the model) between two decode steps,
        and tag every token sampled from then on with `version`. Rows running at that moment keep their
        cache and go on with the new weights (a partial rollout; each records the switch)."""
        with self._lock:
            self._swap = (version, load)

    def _apply_swap(self, batch: _Batch) -> None:
        with self._lock:
            swap, self._swap = self._swap, None
        if swap is None:
            return
        version, load = swap
        with torch.no_grad():
            load()
        # the next token of a running row is sampled from logits the old weights computed
        for req in batch.rows:
            req.switches.append((len(req.ids) + 1, version))
        self.version, self.weights = version, _fingerprint(self.model)

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> Generation:
        loop = asyncio.get_running_loop()
        request = _Request(list(prompt_ids), params, loop.create_future(), loop)
        if params.max_new_tokens <= 0:
            return Generation([], [], "length")
        self._inbox.put(request)
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="hf-engine", daemon=True)
                self._thread.start()
        return await request.future

    def sync(self, version: int) -> None:
        """Take policy `version`: the weights are the trainer's own (shared), so this only stamps later turns
        with the version and this engine's fingerprint of the weights it generates with (rl_factory/guard)."""
        if self.tracks_versions:  # weights of its own: each swap stamps its version and fingerprint
            return
        self.version, self.weights = version, _fingerprint(self.model)

    async def close(self) -> None:
        thread = self._thread
        if thread is not None and thread.is_alive():
            self._inbox.put(None)
            await asyncio.to_thread(thread.join)
        self._thread = None

    @property
    def kv_slots(self) -> KVSlots | None:
        """The running batch's key/value slots (None before the first request)."""
        return self._batch.kv if self._batch is not None else None

    def metrics(self) -> dict[str, float]:
        """Engine counters since the last call: mean rows per decode step, tokens/s while busy."""
        c, self.counters = self.counters, {"decode_steps": 0, "row_steps": 0, "tokens": 0, "busy_s": 0.0}
        return {
            "engine/mean_batch_size": c["row_steps"] / c["decode_steps"] if c["decode_steps"] else 0.0,
            "engine/tokens_per_s": c["tokens"] / c["busy_s"] if c["busy_s"] else 0.0,
            "engine/busy_s": c["busy_s"],
        }

    # ---- the decode thread ----------------------------------------------------------------------

    def _run(self) -> None:
        torch.set_num_threads(self.threads)  # this thread's only (see `threads`); before min_rows() is read
        try:
            batch = self._batch = _Batch(self)
        except Exception as exc:  # a model this engine cannot drive: every request gets the error, none hangs
            error = RuntimeError(f"the hf engine cannot drive this model: {type(exc).__name__}: {exc}")
            while (req := self._inbox.get()) is not None:
                req.resolve(error=error)
            return
        pending, waited = [], 0
        while True:
            block = not batch.rows and not pending
            try:
                first = self._inbox.get(block=block, timeout=None if block else 0)
            except queue.Empty:
                first = False
            if first is None:  # close()
                batch.fail(RuntimeError("engine closed"), extra=pending)
                return
            if first is not False:
                pending.append(first)
            if block and self.batch_wait_s:
                time.sleep(self.batch_wait_s)
            while True:
                try:
                    item = self._inbox.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    self._inbox.put(None)
                    break
                pending.append(item)
            # Each prefill is a forward of its own: while rows decode, requests coming back from their
            # tools wait up to `admit_every` steps to be prefilled together (results do not depend on it).
            room = self.max_batch_size - len(batch.rows)
            admit = room > 0 and pending and (not batch.rows or waited >= self.admit_every or len(pending) >= room)
            arrivals, pending = (pending[:room], pending[room:]) if admit else ([], pending)
            waited = 0 if admit or not pending else waited + 1
            if not arrivals and not batch.rows:
                continue
            try:
                start = time.perf_counter()
                if self._swap is not None:
                    self._apply_swap(batch)
                for req in arrivals:
                    req.version = self.version if self.tracks_versions else None
                with torch.no_grad(), self.autocast():
                    if arrivals:
                        batch.join(arrivals)
                    batch.step()
                self.counters["busy_s"] += time.perf_counter() - start
            except Exception as exc:  # fail the callers, keep serving new requests
                batch.fail(exc, extra=arrivals)
                batch = self._batch = _Batch(self, prefixes=batch.prefixes)


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
                                                   "length", receipt(self.rows[i].ids, e.version, e.weights),
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

    def fail(self, exc: BaseException, extra: list[_Request] = ()) -> None:
        for req in [*self.rows, *extra]:
            req.resolve(error=exc)
        self.rows = []


def _fingerprint(model) -> str:
    from rl_factory.guard.checks.receipts import weight_fingerprint

    return weight_fingerprint(model)
