"""A pairwise judge running a local Hugging Face causal LM with transformers (CPU by default).

It does not generate and parse a reply: it renders the judge prompt as a user turn (through the model's
chat template when it has one), appends `Winner:` and reads the next-token distribution, so
P(A beats B) = p("A") / (p("A") + p("B")), summing the probabilities of "A" and " A" (and of "B" and " B").
Deterministic, no parsing, no retries. Like every model judge it judges both orders and caches by
ordered pair (`PairwiseModelJudge`). Calls are serialized (one model) and run in a worker thread so the
event loop keeps serving rollouts and tools. A prompt longer than the model's context is a `JudgeError`.
"""
from __future__ import annotations

import asyncio
from typing import Any

from rewards.pairwise import JudgeConfig, PairwiseModelJudge
from rl_factory.base.judging import JudgeError

ANSWER_PREFIX = "Winner:"
INSTRUCTION = "\n\nWhich agent is better? Answer with A or B."


class HFJudge(PairwiseModelJudge):
    """Pairwise judge over a local model directory (`judge.model_path`, `judge.device`)."""

    def __init__(self, cfg: JudgeConfig):
        super().__init__(cfg.prompt)
        if not cfg.model_path:
            raise ValueError("judge type 'hf' needs judge.model_path (a local model directory or hub id)")
        self.cfg = cfg
        self._lock = asyncio.Lock()
        self._loaded: tuple[Any, Any, list[int], list[int]] | None = None

    def _load(self) -> tuple[Any, Any, list[int], list[int]]:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(self.cfg.model_path)
        model = AutoModelForCausalLM.from_pretrained(self.cfg.model_path).to(self.cfg.device).eval()

        def first_tokens(*texts: str) -> list[int]:
            return sorted({ids[0] for ids in (tokenizer.encode(t, add_special_tokens=False) for t in texts) if ids})

        return tokenizer, model, first_tokens("A", " A"), first_tokens("B", " B")

    def _score(self, prompt: str) -> float:
        import torch

        if self._loaded is None:
            self._loaded = self._load()
        tokenizer, model, a_ids, b_ids = self._loaded
        text = prompt + INSTRUCTION
        if getattr(tokenizer, "chat_template", None):
            text = tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                                 add_generation_prompt=True, enable_thinking=False)
        ids = tokenizer.encode(text + ANSWER_PREFIX, add_special_tokens=False)
        limit = getattr(model.config, "max_position_embeddings", None)
        if limit and len(ids) > limit:
            raise JudgeError(f"judge prompt has {len(ids)} tokens; {self.cfg.model_path} takes {limit}")
        with torch.no_grad():
            logits = model(torch.tensor([ids], device=model.device)).logits[0, -1].float()
        probs = torch.softmax(logits, -1)
        p_a, p_b = float(probs[a_ids].sum()), float(probs[b_ids].sum())
        return p_a / (p_a + p_b) if p_a + p_b > 0 else 0.5

    async def judge_prompt(self, prompt: str) -> float:
        async with self._lock:
            self.stats["requests"] += 1
            return await asyncio.to_thread(self._score, prompt)

    async def aclose(self) -> None:
        self._loaded = None
