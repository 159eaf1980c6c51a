"""Generation engines behind one async interface (`await engine.generate(prompt_ids, params)`).

Engines are looked up by name in `ENGINES`; each takes token ids in and gives token ids out, with
the log-prob of every sampled token, so the rollout never decodes and re-encodes model output.
"""
from __future__ import annotations

from rl_factory.engines.base import ENGINES, Generation, SamplingParams, register_engine

__all__ = ["ENGINES", "Generation", "SamplingParams", "register_engine"]
