"""The embedded engine: a Hugging Face causal LM with continuous batching, on CPU or one GPU.

Rollout tasks call `generate` concurrently. One decode thread keeps a running batch with a shared
KV cache and advances every row by one token per step; a request that arrives mid-decode is
prefilled and *joins the running batch at the next step* (its cache is left-padded to the batch's
length and concatenated), and a finished row leaves at once. So a trajectory back from its tool
call never waits for the rest of the batch, and the engine stays busy while tools run.

Rows may differ in temperature, top-p and token budget. The log-prob of every sampled token under
softmax(logits / temperature) is recorded (temperature 1 for greedy rows), the quantity the trainer
recomputes. The decode thread runs outside the event loop, so tool calls proceed while the model
computes.
"""
from __future__ import annotations

import asyncio
import contextlib
import inspect
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from rl_factory.engines.base import Generation, SamplingParams, register_engine


@dataclass
class _Request:
    prompt_ids: list[int]
    params: SamplingParams
    future: asyncio.Future = field(repr=False)
    loop: asyncio.AbstractEventLoop = field(repr=False)
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)

    def resolve(self, result: Any = None, error: BaseException | None = None) -> None:
        def settle():
            if not self.future.done():
                self.future.set_exception(error) if error else self.future.set_result(result)
        self.loop.call_soon_threadsafe(settle)


@register_engine("hf")
class HFEngine:
    """Continuous-batching generation with a transformers model.

    Args:
        model: a causal LM (its weights are shared with the trainer: generation is on-policy).
        eos_token_id: the end-of-turn token; a row stops after generating it.
        pad_token_id: used for left padding inside the batch.
        max_batch_size: rows decoded together; further requests join as rows finish.
        batch_wait_s: when the engine is idle, how long the first request waits for company before
            prefill (0 is fine: later arrivals join the running batch anyway).
        autocast: context-manager factory for mixed precision (the policy's).
    """

    def __init__(self, model, eos_token_id: int, pad_token_id: int, max_batch_size: int = 64,
                 batch_wait_s: float = 0.002, autocast: Callable[[], Any] = contextlib.nullcontext):
        self.model = model
        self.eos_token_id = eos_token_id
        self.pad_token_id = pad_token_id
        self.max_batch_size = max_batch_size
        self.batch_wait_s = batch_wait_s
        self.autocast = autocast
        # transformers renamed `past_key_values` to `cache`; use whichever this version takes.
        params = inspect.signature(model.forward).parameters
        self._cache_arg = "cache" if "cache" in params else "past_key_values"
        self._inbox: queue.Queue[_Request | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.stats = {"batches": 0, "rows": 0}  # prefills (joins) and rows prefilled
        self.max_rows = 0  # largest running batch seen (tests check that joins happen mid-decode)
        self.counters = {"decode_steps": 0, "row_steps": 0, "tokens": 0, "busy_s": 0.0}

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

    async def close(self) -> None:
        thread = self._thread
        if thread is not None and thread.is_alive():
            self._inbox.put(None)
            await asyncio.to_thread(thread.join)
        self._thread = None

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
        batch = _Batch(self)
        while True:
            block = not batch.rows
            try:
                first = self._inbox.get(block=block, timeout=None if block else 0)
            except queue.Empty:
                first = False
            if first is None:  # close()
                batch.fail(RuntimeError("engine closed"))
                return
            arrivals = [] if first is False else [first]
            if block and self.batch_wait_s:
                time.sleep(self.batch_wait_s)
            while len(batch.rows) + len(arrivals) < self.max_batch_size:
                try:
                    item = self._inbox.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    self._inbox.put(None)
                    break
                arrivals.append(item)
            try:
                start = time.perf_counter()
                with torch.no_grad(), self.autocast():
                    if arrivals:
                        batch.join(arrivals)
                    batch.step()
                self.counters["busy_s"] += time.perf_counter() - start
            except Exception as exc:  # fail the callers, keep serving new requests
                batch.fail(exc)
                batch = _Batch(self)


class _Batch:
    """The running batch: its rows, their shared KV cache and the logits of each row's next token."""

    def __init__(self, engine: HFEngine):
        self.e = engine
        self.rows: list[_Request] = []
        self.cache = None
        self.attn: torch.Tensor | None = None  # [B, L] 1 on real tokens (rows are left-padded)
        self.logits: torch.Tensor | None = None  # [B, V] for each row's next token

    @property
    def device(self) -> torch.device:
        return next(self.e.model.parameters()).device

    def _forward(self, ids: torch.Tensor, attn: torch.Tensor, position: torch.Tensor, cache):
        was_training = self.e.model.training
        self.e.model.eval()
        out = self.e.model(input_ids=ids, attention_mask=attn, position_ids=position, use_cache=True,
                           **{self.e._cache_arg: cache})
        self.e.model.train(was_training)
        return out.logits[:, -1, :].float(), getattr(out, self.e._cache_arg)

    def join(self, reqs: list[_Request]) -> None:
        """Prefill new requests and merge them into the running batch."""
        self.e.stats["batches"] += 1
        self.e.stats["rows"] += len(reqs)
        width = max(len(r.prompt_ids) for r in reqs)
        ids = torch.full((len(reqs), width), self.e.pad_token_id, dtype=torch.long)
        attn = torch.zeros((len(reqs), width), dtype=torch.long)
        for i, r in enumerate(reqs):
            ids[i, width - len(r.prompt_ids):] = torch.tensor(r.prompt_ids)
            attn[i, width - len(r.prompt_ids):] = 1
        ids, attn = ids.to(self.device), attn.to(self.device)
        position = (attn.cumsum(-1) - 1).clamp(min=0)
        logits, cache = self._forward(ids, attn, position, None)
        if not self.rows:
            self.rows, self.cache, self.attn, self.logits = list(reqs), cache, attn, logits
            return
        length = max(self.attn.shape[1], width)
        _merge_caches(self.cache, cache, length)
        self.attn = torch.cat([_left_pad(self.attn, length), _left_pad(attn, length)])
        self.logits = torch.cat([self.logits, logits])
        self.rows += reqs

    def step(self) -> None:
        """Sample one token for every row, retire finished rows, and run the next forward."""
        counters = self.e.counters
        counters["decode_steps"] += 1
        counters["row_steps"] += len(self.rows)
        self.e.max_rows = max(self.e.max_rows, len(self.rows))
        tokens, logprobs = _sample_rows(self.logits, [r.params for r in self.rows])
        keep = []
        for i, (req, tok, lp) in enumerate(zip(self.rows, tokens.tolist(), logprobs.tolist())):
            req.ids.append(tok)
            req.logprobs.append(lp)
            counters["tokens"] += 1
            if tok == self.e.eos_token_id:
                req.resolve(Generation(req.ids, req.logprobs, "stop"))
            elif len(req.ids) >= req.params.max_new_tokens:
                req.resolve(Generation(req.ids, req.logprobs, "length"))
            else:
                keep.append(i)
        if not keep:
            self.rows, self.cache, self.attn, self.logits = [], None, None, None
            return
        if len(keep) < len(self.rows):
            index = torch.tensor(keep, device=self.device)
            self.cache.batch_select_indices(index)
            self.rows = [self.rows[i] for i in keep]
            self.attn, tokens = self.attn[index], tokens[index]
            self._trim()
        self.attn = torch.cat([self.attn, torch.ones_like(self.attn[:, :1])], dim=1)
        position = self.attn.sum(-1, keepdim=True) - 1
        self.logits, self.cache = self._forward(tokens[:, None], self.attn, position, self.cache)

    def _trim(self) -> None:
        """Drop cache columns that are padding for every remaining row (they only cost compute)."""
        pad = int((self.attn.cumsum(-1) == 0).sum(-1).min())
        if pad > 0:
            self.attn = self.attn[:, pad:]
            for layer in _layers(self.cache):
                layer.keys, layer.values = layer.keys[:, :, pad:], layer.values[:, :, pad:]

    def fail(self, exc: BaseException) -> None:
        for req in self.rows:
            req.resolve(error=exc)
        self.rows = []


def _layers(cache) -> list:
    layers = getattr(cache, "layers", None)
    if layers is None:
        raise RuntimeError("this transformers version's KV cache has no per-layer tensors to merge")
    return layers


def _left_pad(t: torch.Tensor, length: int, dim: int = 1) -> torch.Tensor:
    missing = length - t.shape[dim]
    if missing <= 0:
        return t
    shape = list(t.shape)
    shape[dim] = missing
    return torch.cat([t.new_zeros(shape), t], dim=dim)


def _merge_caches(running, new, length: int) -> None:
    """Append the rows of `new` to `running` in place, left-padding both to `length` positions."""
    for a, b in zip(_layers(running), _layers(new)):
        a.keys = torch.cat([_left_pad(a.keys, length, 2), _left_pad(b.keys, length, 2)])
        a.values = torch.cat([_left_pad(a.values, length, 2), _left_pad(b.values, length, 2)])


def _sample_rows(logits: torch.Tensor, params: list[SamplingParams]) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per row with that row's temperature/top-p; its log-prob under softmax(logits / T).

    Greedy rows (temperature 0) take the argmax and report its log-prob at temperature 1.
    """
    temps = torch.tensor([p.temperature for p in params], device=logits.device, dtype=logits.dtype)
    greedy = temps <= 0
    scaled = logits / torch.where(greedy, torch.ones_like(temps), temps)[:, None]
    logprobs = torch.log_softmax(scaled, dim=-1)
    probs = logprobs.exp()
    top_p = torch.tensor([p.top_p for p in params], device=logits.device, dtype=logits.dtype)
    if bool((top_p < 1.0).any()):
        sorted_p, order = probs.sort(dim=-1, descending=True)
        keep = (sorted_p.cumsum(-1) - sorted_p) < top_p[:, None]  # always keeps the top token
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_p * keep)
    sampled = torch.multinomial(probs, 1).squeeze(-1)
    token = torch.where(greedy, logits.argmax(dim=-1), sampled)
    return token, logprobs.gather(-1, token[:, None]).squeeze(-1)
