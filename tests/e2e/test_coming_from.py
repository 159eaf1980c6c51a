"""A setup brought from verl: a dataset in verl's layout (Parquet) and a reward with verl's signature train two
steps with `bash main_grpo.sh` on the embedded backend, and compose into verl's config with `--cfg job`."""
import json
import os
import subprocess

import pytest
import yaml

from tests.compat_fixtures import DATA_SOURCE, VERL_REWARD, write_verl_parquet
from tests.e2e.test_main_scripts import (REPO, calculator_pids, marked_calculator_manifest, metrics_lines,
                                         no_server_left, run_script, tiny_overrides)
from tests.records import jsonl

pytestmark = pytest.mark.slow  # the launch scripts and training runs, end to end


def test_verl_data_and_reward_train_two_steps_on_the_embedded_backend(tiny_model_dir, tmp_path, monkeypatch):
    log = tmp_path / "reward_calls.jsonl"
    monkeypatch.setenv("VERL_REWARD_LOG", str(log))  # the fixture reward notes what it was given
    manifest, marker = marked_calculator_manifest(tmp_path)
    data, rows = write_verl_parquet(tmp_path / "train.parquet")
    run = tmp_path / "run"
    result = run_script("main_grpo.sh", *tiny_overrides(tiny_model_dir, run, manifest),
                        f"data.train_files={data}", f"data.val_files={data}",
                        f"reward.function={VERL_REWARD}:compute_score")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "answer: from reward_model.ground_truth in 4 row(s)" in result.stdout + result.stderr
    truths = {r["prompt"][0]["content"]: r["reward_model"]["ground_truth"] for r in rows}
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(calls) == 4 + 2 * 2 * 2 + 4  # validation at steps 0 and 2, two steps of 2 prompts x 2 rollouts
    by_index = {r["extra_info"]["index"]: r for r in rows}
    for call in calls:
        assert call["data_source"] == DATA_SOURCE and call["kwargs"] == []
        assert call["extra_info"] == by_index[call["extra_info"]["index"]]["extra_info"]  # the row's own
        question = by_index[call["extra_info"]["index"]]["prompt"][0]["content"]
        assert call["ground_truth"] == truths[question]
    steps = [m for m in metrics_lines(run) if "reward/mean" in m]
    assert [m["step"] for m in steps] == [1, 2] and all("reward/acc/mean" in m for m in steps)
    records = jsonl(run / "rollouts" / "step_000001.jsonl")
    completions = {c["solution_str"] for c in calls}
    for record in records:
        assert record["answer"] == truths[record["messages"][0]["content"]]
        assert set(record["reward_info"]) == {"acc", "pred"} and record["reward"] == record["reward_info"]["acc"]
        assert record["turn_texts"][-1] in completions  # solution_str was the final assistant message
    assert no_server_left(marker), calculator_pids(marker)


def test_verl_data_and_reward_compose_into_verls_config(tmp_path):
    pytest.importorskip("verl", reason="verl is an extra: bash setup.sh --dev (verl-cpu)")
    data, _ = write_verl_parquet(tmp_path / "train.parquet")
    run = subprocess.run(["bash", "main_grpo.sh", "trainer.backend=verl", f"data.train_files={data}",
                          f"data.val_files={data}", f"reward.function={VERL_REWARD}:compute_score",
                          "data.max_prompt_length=1024", "actor_rollout_ref.rollout.n=4",  # verl's own keys
                          f"trainer.output_dir={tmp_path / 'run'}", "--cfg", "job"],
                         cwd=REPO, capture_output=True, text=True, timeout=300, env=dict(os.environ))
    assert run.returncode == 0, run.stderr[-2000:]
    cfg = yaml.safe_load(run.stdout)
    ours = cfg["reward"]["custom_reward_function"]
    assert ours["path"] == "pkg://rl_factory.backends.verl.reward"  # our adapter calls the user's function
    assert ours["reward_kwargs"]["rl_factory"]["reward"]["function"] == f"{VERL_REWARD}:compute_score"
    assert cfg["rl_factory"]["data"]["train_files"] == str(data)
    assert cfg["data"]["max_prompt_length"] == 1024 and cfg["actor_rollout_ref"]["rollout"]["n"] == 4
    assert not (tmp_path / "run").exists()
