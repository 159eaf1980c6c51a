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
from typing import Any, Callable

import torch
from transformers import AttentionInterface

from rl_factory.engines.base import Generation, SamplingParams, register_engine
from rl_factory.engines.hf_batch import RAGGED_ATTENTION, _Batch, _Request
from rl_factory.engines.kv import KVSlots, ragged_attention

# Key/value slots up to this size are allocated whole at the first forward (the default job's tiny model:
# 128 rows x 512 positions = 134 MB); bigger ones grow on demand, so a long max_context on a GPU model
# costs only the positions its rows reach.
KV_PREALLOC_BYTES = 1 << 30
AttentionInterface.register(RAGGED_ATTENTION, ragged_attention)


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
        self.threads_auto = not threads  # the default split: the async trainer may split the cores anew
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
        # Under LoRA, the synced fingerprint's parts: the parameters' and, as one tuple (read by the decode thread
        # in every forward), the adapter layers with the state they were synced in. A forward that finds another
        # state stamps its rows with it (rl_factory/engines/hf_batch.py).
        self.sums: str | None = None
        self.adapter_state: tuple[list, tuple] = ([], ())
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
        self._stamp(version)

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
        self._stamp(version)

    def _stamp(self, version: int) -> None:
        from rl_factory.guard.fingerprint import adapter_key, adapter_layers, adapter_part, sums_fingerprint

        layers = adapter_layers(self.model)
        key = adapter_key(layers)
        self.sums = sums_fingerprint(self.model)
        self.adapter_state = (layers, key)
        self.version, self.weights = version, self.sums + adapter_part(key)

    def weights_with(self, key: tuple) -> str:
        """The fingerprint of the synced parameters computed with the adapter state `key` (a turn that a forward
        generated with the adapter in another state than the synced one)."""
        from rl_factory.guard.fingerprint import adapter_part

        return (self.sums or "") + adapter_part(key)

    async def close(self) -> None:
        thread = self._thread
        if thread is not None and thread.is_alive():
            self._inbox.put(None)
            await asyncio.to_thread(thread.join)
        self._thread = None

    @property
    def started(self) -> bool:
        """The decode thread has started (its torch thread count, `threads`, is fixed from then on)."""
        return self._thread is not None

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
            pending.sort(key=lambda r: r.params.priority)  # stable: arrival order among equals
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

