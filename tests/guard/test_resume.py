"""The run guard's state survives a resume: saved with each checkpoint, restored, not recomputed.

A LoRA run trains two steps and stops (its last step saves a checkpoint with `guard_state.json`); its reward
file is rewritten; the run resumes for a third step. The baselines the third step judges against are the saved
ones, the rewrite is caught against the fingerprint taken when the run first started, and the resumed adapter
weights are the saved ones (no receipts alarm). The verl logger's side: tests/backends/test_verl_run_dir.py.
"""
from __future__ import annotations

import json
import statistics

import pytest

from rl_factory.config import load_config
from rl_factory.guard import GuardStop
from tests.guard.test_faults import PARITY_REWARD, bundle_of, overrides, reward_file

pytestmark = pytest.mark.slow  # trains a tiny run twice


def test_a_resumed_run_keeps_the_guards_baselines_and_catches_a_file_rewritten_before_it(tiny_model_dir, tmp_path):
    from rl_factory.trainer import train

    run = tmp_path / "run"
    reward = reward_file(tmp_path, PARITY_REWARD)
    args = [a for a in overrides(tiny_model_dir, run, f"reward.function={reward}:reward", "model.lora_rank=4",
                                 "model.lora_alpha=8", "trainer.guard.tools.baseline_steps=2",
                                 "trainer.guard.logprob_gap.baseline_steps=2")
            if not a.startswith("trainer.total_steps")]
    train(load_config("grpo", [*args, "trainer.total_steps=2"]))
    first = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    # a normal LoRA run: the engine's receipts (adapter state included) are the trainer's
    assert [m["guard/violations"] for m in first if m["step"] > 0] == [0.0, 0.0]
    assert all(m["guard/receipts/weights_mismatch"] == 0 for m in first if m["step"] > 0)
    saved = json.loads((run / "checkpoints" / "step_000002" / "guard_state.json").read_text())
    assert saved["step"] == 2 and "+lora28/28." in saved["fingerprints"]["2"]
    seen = saved["checks"]["tools"]["seen"]
    gaps = saved["checks"]["logprob_gap"]["numerics"]
    assert len(seen) == 2 and len(gaps) == 2
    assert str(reward.resolve()) in saved["checks"]["reward_files"]["start"]

    reward.write_text(PARITY_REWARD + "# edited while the run was down\n")  # the fault, before the resume
    with pytest.raises(GuardStop) as stopped:
        train(load_config("grpo", [*args, "trainer.total_steps=3"]))
    assert "reward_files at step 3" in str(stopped.value) and str(reward.resolve()) in str(stopped.value)
    assert "resumed from" in (run / "train.log").read_text()
    step3 = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()][-1]
    assert step3["step"] == 3
    # judged against the saved baselines: a recomputed one would still be collecting (no baseline metric)
    assert step3["guard/tools/call_rate/baseline"] == statistics.fmean(s["call_rate"] for s in seen)
    assert step3["guard/logprob_gap/baseline"] == statistics.fmean(gaps)
    assert step3["guard/receipts/weights_mismatch"] == 0  # the adapter came back as it was saved
    bundle = bundle_of(run, "reward_files")
    before = json.loads((bundle / "check.json").read_text())["state"]
    assert before["start"] == saved["checks"]["reward_files"]["start"]
