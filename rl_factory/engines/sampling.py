"""Per-row sampling for the embedded engine: each row draws from its own seeded stream, so a token depends
only on the row's logits and its request's seed, never on which rows share the batch."""
from __future__ import annotations

import torch

from rl_factory.engines.base import SamplingParams


def uniforms(params: SamplingParams) -> torch.Tensor | None:
    """The request's own random stream: one uniform in (0, 1] per token it may sample."""
    if params.temperature <= 0:
        return None
    gen = torch.Generator()
    gen.manual_seed(params.seed if params.seed is not None else int(torch.randint(0, 2**62, (1,))))
    return 1.0 - torch.rand(params.max_new_tokens, generator=gen, dtype=torch.float64)


def sample_rows(logits: torch.Tensor, rows: list) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per row with that row's temperature/top-p; its log-prob under softmax(logits / T).

    Sampled rows invert the CDF of their (top-p filtered) distribution at the row's next uniform, so
    a token depends only on the row's logits and its own stream. Greedy rows (temperature 0) take
    the argmax and report its log-prob at temperature 1. `rows`: the engine's requests, each with its
    `params`, its `uniforms` stream and the `ids` it has sampled so far.
    """
    params = [r.params for r in rows]
    temps = torch.tensor([p.temperature for p in params], device=logits.device, dtype=logits.dtype)
    greedy = temps <= 0
    scaled = logits / torch.where(greedy, torch.ones_like(temps), temps)[:, None]
    logprobs = torch.log_softmax(scaled, dim=-1)
    token = logits.argmax(dim=-1)
    if not bool(greedy.all()):
        probs = logprobs.exp()
        top_p = torch.tensor([p.top_p for p in params], device=logits.device, dtype=logits.dtype)
        if bool((top_p < 1.0).any()):
            sorted_p, order = probs.sort(dim=-1, descending=True, stable=True)
            keep = (sorted_p.cumsum(-1) - sorted_p) < top_p[:, None]  # always keeps the top token
            probs = torch.zeros_like(probs).scatter(-1, order, sorted_p * keep)
        u = torch.tensor([float(r.uniforms[len(r.ids)]) if r.uniforms is not None else 1.0 for r in rows],
                         device=logits.device, dtype=torch.float64)
        cdf = probs.double().cumsum(-1)
        sampled = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None]).squeeze(-1).clamp(max=logits.shape[-1] - 1)
        token = torch.where(greedy, token, sampled)
    return token, logprobs.gather(-1, token[:, None]).squeeze(-1)
