"""Rewards end to end through `bash main_grpo.sh`: weighted rule rewards, and a reward that raises."""
import json

import pytest

from tests.e2e.test_main_scripts import (calculator_pids, marked_calculator_manifest, metrics_lines, no_server_left,
                                         run_script, tiny_overrides)
from tests.records import jsonl

pytestmark = pytest.mark.slow  # the launch scripts and training runs, end to end

BROKEN = "def reward(completion, answer):\n    raise ValueError(f'cannot grade {answer!r}')\n"


def data_with_ids(directory):
    rows = [{"id": f"calc-{i}", "prompt": f"What is {a} + {b}?", "answer": str(a + b)}
            for i, (a, b) in enumerate([(2033, 5179), (607, 8364), (15, 27), (120, 5)])]
    path = directory / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path, rows


def functions_override(broken) -> str:
    return ("reward.functions=[{function: 'rewards.rules:numeric_match', weight: 1.0, name: correct}, "
            "{function: 'rewards.rules:tool_calls_valid', weight: 0.1, name: format}, "
            f"{{function: '{broken}:reward', weight: 0.5, name: broken}}]")


def test_a_raising_reward_stops_the_run_naming_the_sample(tiny_model_dir, tmp_path):
    manifest, marker = marked_calculator_manifest(tmp_path)
    broken = tmp_path / "broken_reward.py"
    broken.write_text(BROKEN)
    data, rows = data_with_ids(tmp_path)
    result = run_script("main_grpo.sh", *tiny_overrides(tiny_model_dir, tmp_path / "run", manifest),
                        f"data.train_files={data}", f"data.val_files={data}", "data.val_limit=2",
                        "rollout.max_response_tokens=4", functions_override(broken))
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and len(errors[0]) < 400, result.stderr[-3000:]
    for text in ("broken_reward.py:reward", "sample 0", "id 'calc-0'", rows[0]["prompt"],
                 "ValueError: cannot grade '7212'", "inputs: completion="):
        assert text in errors[0], (text, errors[0])
    assert no_server_left(marker), calculator_pids(marker)


def test_on_error_zero_keeps_training_and_counts_the_errors(tiny_model_dir, tmp_path):
    manifest, marker = marked_calculator_manifest(tmp_path)
    broken = tmp_path / "broken_reward.py"
    broken.write_text(BROKEN)
    run = tmp_path / "run"
    result = run_script("main_grpo.sh", *tiny_overrides(tiny_model_dir, run, manifest), "trainer.total_steps=1",
                        "data.val_limit=2", functions_override(broken), "reward.on_error=zero",
                        "reward.executor=process", "reward.timeout_s=60")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    first_val, step = metrics_lines(run)
    assert first_val["val/reward/errors"] == 2  # one failing component per validation row
    assert step["reward/errors"] == 2 * 2  # train_batch_size * rollout.n
    assert step["reward/broken/mean"] == 0.0
    assert 0.0 <= step["reward/correct/mean"] <= 1.0 and 0.0 <= step["reward/format/mean"] <= 1.0
    records = jsonl(run / "rollouts" / "step_000001.jsonl")
    for r in records:
        info = r["reward_info"]
        assert info["broken"] == 0.0 and info["broken/reward_error"].startswith("ValueError: cannot grade")
        assert r["reward"] == info["correct"] + 0.1 * info["format"]
    assert no_server_left(marker), calculator_pids(marker)
