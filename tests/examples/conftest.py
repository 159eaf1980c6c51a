"""Shared by the example tests: two training steps of an example on the session's tiny model, in-process."""
from __future__ import annotations

import json
from pathlib import Path

import pytest


@pytest.fixture()
def two_steps(tiny_model_dir, tmp_path):
    """two_steps(*overrides) -> the metrics.jsonl lines of a 2-step embedded run (train() in this process:
    the same code as `bash main_grpo.sh`, without another interpreter loading torch)."""
    from rl_factory.config import load_config
    from rl_factory.trainer import train

    def run(*overrides: str) -> list[dict]:
        run_dir = tmp_path / "run"
        cfg = load_config("grpo", [f"model.path={tiny_model_dir}", "model.device=cpu", "trainer.total_steps=2",
                                   "data.train_batch_size=2", "rollout.n=2", "data.val_limit=2", "env.max_turns=2",
                                   "rollout.max_response_tokens=32", f"trainer.output_dir={run_dir}",
                                   "trainer.eval_every=0", "trainer.save_every=0", "trainer.report=false",
                                   "trainer.progress=false", *overrides])
        train(cfg)
        return [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]
    return run
