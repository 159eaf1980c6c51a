"""The embedded engine: a Hugging Face causal LM generating in micro-batches on CPU or one GPU.

Rollout tasks call `generate` concurrently; a single batching task gathers whatever requests are
waiting (there is no per-turn barrier: a trajectory back from its tool call joins the next batch)
and runs one batched, KV-cached decode in a worker thread, so the event loop keeps serving tool
calls while the model generates.
"""
from __future__ import annotations

import asyncio
import contextlib
import inspect
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from rl_factory.engines.base import Generation, SamplingParams, register_engine


@dataclass
class _Request:
    prompt_ids: list[int]
    params: SamplingParams
    future: asyncio.Future = field(repr=False)


@register_engine("hf")
class HFEngine:
    """Batched generation with a transformers model.

    Args:
        model: a causal LM (its weights are shared with the trainer: generation is on-policy).
        eos_token_id: the end-of-turn token; generation of a row stops after it.
        pad_token_id: used for left padding inside a batch.
        max_batch_size: rows per decode; more waiting requests run in the next batch.
        batch_wait_s: how long the batcher lingers for more requests before it starts a batch.
    """

    def __init__(self, model, eos_token_id: int, pad_token_id: int, max_batch_size: int = 64,
                 batch_wait_s: float = 0.005, autocast: Callable[[], Any] = contextlib.nullcontext):
        self.model = model
        self.autocast = autocast
        # transformers renamed `past_key_values` to `cache`; use whichever this version takes.
        params = inspect.signature(model.forward).parameters
        self._cache_arg = "cache" if "cache" in params else "past_key_values"
        self.eos_token_id = eos_token_id
        self.pad_token_id = pad_token_id
        self.max_batch_size = max_batch_size
        self.batch_wait_s = batch_wait_s
        self._queue: asyncio.Queue[_Request] | None = None
        self._worker: asyncio.Task | None = None
        self.stats = {"batches": 0, "rows": 0}

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> Generation:
        if self._worker is None or self._worker.done():
            self._queue = asyncio.Queue()
            self._worker = asyncio.get_running_loop().create_task(self._serve())
        future = asyncio.get_running_loop().create_future()
        await self._queue.put(_Request(list(prompt_ids), params, future))
        return await future

    async def close(self) -> None:
        if self._worker is not None:
            self._worker.cancel()
            await asyncio.gather(self._worker, return_exceptions=True)
            self._worker = None

    async def _serve(self) -> None:
        while True:
            pending = [await self._queue.get()]
            await asyncio.sleep(self.batch_wait_s)
            while not self._queue.empty():
                pending.append(self._queue.get_nowait())
            # Rows in one decode must share sampling settings; max_new_tokens may differ per row.
            by_params: dict[tuple, list[_Request]] = {}
            for req in pending:
                by_params.setdefault((req.params.temperature, req.params.top_p), []).append(req)
            for reqs in by_params.values():
                for start in range(0, len(reqs), self.max_batch_size):
                    chunk = reqs[start: start + self.max_batch_size]
                    try:
                        outs = await asyncio.to_thread(self._decode, chunk)
                    except Exception as exc:  # fail the callers, keep serving
                        for req in chunk:
                            if not req.future.done():
                                req.future.set_exception(exc)
                        continue
                    for req, out in zip(chunk, outs):
                        if not req.future.done():
                            req.future.set_result(out)

    @torch.no_grad()
    def _decode(self, reqs: list[_Request]) -> list[Generation]:
        self.stats["batches"] += 1
        self.stats["rows"] += len(reqs)
        model = self.model
        device = next(model.parameters()).device
        width = max(len(r.prompt_ids) for r in reqs)
        rows = len(reqs)
        input_ids = torch.full((rows, width), self.pad_token_id, dtype=torch.long)
        attn = torch.zeros((rows, width), dtype=torch.long)
        for i, r in enumerate(reqs):  # left padding keeps every row's next token in the last column
            input_ids[i, width - len(r.prompt_ids):] = torch.tensor(r.prompt_ids)
            attn[i, width - len(r.prompt_ids):] = 1
        input_ids, attn = input_ids.to(device), attn.to(device)
        limits = torch.tensor([r.params.max_new_tokens for r in reqs], device=device)
        temperature, top_p = reqs[0].params.temperature, reqs[0].params.top_p
        out_ids = torch.zeros((rows, int(limits.max())), dtype=torch.long, device=device)
        out_lp = torch.zeros((rows, int(limits.max())), dtype=torch.float32, device=device)
        done = torch.zeros(rows, dtype=torch.bool, device=device)
        lengths = torch.zeros(rows, dtype=torch.long, device=device)
        past, step_ids = None, input_ids
        position = (attn.cumsum(-1) - 1).clamp(min=0)
        step_pos = position
        was_training = model.training
        model.eval()
        for t in range(int(limits.max())):
            with self.autocast():
                out = model(input_ids=step_ids, attention_mask=attn, position_ids=step_pos,
                            use_cache=True, **{self._cache_arg: past})
            past = getattr(out, self._cache_arg)
            logits = out.logits[:, -1, :].float()
            token, logprob = _sample(logits, temperature, top_p)
            active = ~done
            out_ids[active, t] = token[active]
            out_lp[active, t] = logprob[active]
            lengths += active.long()
            done |= (token == self.eos_token_id) | (lengths >= limits)
            if bool(done.all()):
                break
            step_ids = token.unsqueeze(-1)
            attn = torch.cat([attn, torch.ones((rows, 1), dtype=attn.dtype, device=device)], dim=-1)
            step_pos = position[:, -1:] + 1
            position = step_pos
        model.train(was_training)
        results = []
        for i in range(rows):
            n = int(lengths[i])
            ids = out_ids[i, :n].tolist()
            finish = "stop" if n and ids[-1] == self.eos_token_id else "length"
            results.append(Generation(ids, out_lp[i, :n].tolist(), finish))
        return results


def _sample(logits: torch.Tensor, temperature: float, top_p: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row; return it and its log-prob under softmax(logits / temperature)."""
    if temperature <= 0:
        logprobs = torch.log_softmax(logits, dim=-1)
        token = logits.argmax(dim=-1)
        return token, logprobs.gather(-1, token[:, None]).squeeze(-1)
    logprobs = torch.log_softmax(logits / temperature, dim=-1)
    probs = logprobs.exp()
    if top_p < 1.0:
        sorted_p, order = probs.sort(dim=-1, descending=True)
        keep = sorted_p.cumsum(-1) - sorted_p < top_p  # always keeps the top token
        sorted_p = sorted_p * keep
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_p)
    token = torch.multinomial(probs, 1).squeeze(-1)
    return token, logprobs.gather(-1, token[:, None]).squeeze(-1)
