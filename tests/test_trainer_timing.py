"""What the embedded trainer does around its steps that only shows in how long they take: the heap alive
at the start is frozen out of garbage collection while it trains, and validation is timed apart
(`timing/val_s`, outside `timing/step_s`). Keys and states only: speed lives in benchmarks/vs_trl.py."""
from __future__ import annotations

import gc
import json

from rl_factory.config import load_config
from rl_factory.trainer import train
import pytest

pytestmark = pytest.mark.slow  # a training run, timed by phase

# A reward that notes, each time it scores, how many objects are frozen out of garbage collection.
RECORDING_REWARD = """import gc
def reward(completion, **_):
    with open({path!r}, "a") as f:
        f.write(f"{{gc.get_freeze_count()}}\\n")
    return float(len(completion) % 2)
"""


def test_steps_run_on_a_frozen_heap_and_validation_is_timed_apart(tiny_model_dir, tmp_path):
    counts = tmp_path / "freeze_counts.txt"
    reward = tmp_path / "recording_reward.py"
    reward.write_text(RECORDING_REWARD.format(path=str(counts)))
    run_dir = tmp_path / "run"
    cfg = load_config("grpo", [f"model.path={tiny_model_dir}", "model.device=cpu", "trainer.total_steps=2",
                               "data.train_batch_size=2", "rollout.n=2", "data.val_limit=2", "env.max_turns=2",
                               "rollout.max_response_tokens=32", f"trainer.output_dir={run_dir}",
                               "trainer.eval_every=0", "trainer.save_every=0", "trainer.report=false",
                               "trainer.progress=false", f"reward.function={reward}:reward",
                               "trainer.guard.reward_probe.action=off"])  # its probes would score more
    assert gc.get_freeze_count() == 0
    train(cfg)

    seen = [int(line) for line in counts.read_text().split()]
    assert len(seen) == 2 + 2 * (2 * 2) + 2  # validation at step 0 (2 rows), two steps of 2 x 2 rollouts, at the end
    assert min(seen) > 0  # every score, validation's included, ran with the start-up heap frozen
    assert gc.get_freeze_count() == 0  # and train() gave it back to the collector

    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == [0, 1, 2]
    assert lines[0]["timing/val_s"] > 0 and "timing/step_s" not in lines[0]
    assert "timing/val_s" not in lines[1] and "val/accuracy" not in lines[1]
    assert lines[2]["timing/val_s"] > 0 and "val/accuracy" in lines[2]
    for m in lines[1:]:
        assert {"timing/step_s", "timing/rollout_s", "timing/update_s"} <= set(m)
