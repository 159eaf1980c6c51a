"""The rollout pipeline through `bash main_grpo.sh`: filters, dynamic sampling and augmenters in a real run.

Two steps with `zero_variance`, dynamic sampling and `per_turn` views, straight through; then the same
run stopped after step 1 and resumed: step 2 draws the same prompts and trains the same samples.
"""
import json

from tests.e2e.test_main_scripts import marked_calculator_manifest, metrics_lines, no_server_left, run_script, tiny_overrides

PIPELINE = ["rollout.filters=[zero_variance]", "rollout.dynamic_sampling.min_groups=2",
            "rollout.dynamic_sampling.max_rounds=3", "rollout.augment=[per_turn]", "rollout.temperature=1.5"]


def records(run, step):
    return [json.loads(line) for line in (run / "rollouts" / f"step_{step:06d}.jsonl").read_text().splitlines()]


def test_filters_dynamic_sampling_and_views_in_a_run_that_resumes(tiny_model_dir, tmp_path):
    manifest, marker = marked_calculator_manifest(tmp_path)
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    result = run_script("main_grpo.sh", *tiny_overrides(tiny_model_dir, straight, manifest), *PIPELINE)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = metrics_lines(straight)
    for m in lines[1:]:
        assert 1 <= m["rollout/rounds"] <= 3 and m["rollout/prompts"] >= 2
        assert m["rollout/max_rounds_hit"] == float(m["rollout/groups"] < 2)
        # every kept trajectory trains one sample per turn; dropped ones train nothing
        assert m["augment/per_turn/samples"] == m.get("actor/samples", 0)
    for step in (1, 2):
        recs = records(straight, step)
        assert len(recs) == 2 * lines[step]["rollout/prompts"]  # every generated trajectory is written
        dropped = [r for r in recs if r["dropped_by"] is not None]
        assert len(dropped) == lines[step]["filter/zero_variance/dropped"]
        assert all(r["dropped_by"] == "zero_variance" and r["advantage"] is None for r in dropped)
        assert all(isinstance(r["advantage"], float) for r in recs if r["dropped_by"] is None)

    # stopped after step 1 (its checkpoint holds the sampler's position), then resumed to step 2
    first = run_script("main_grpo.sh", *tiny_overrides(tiny_model_dir, resumed, manifest), *PIPELINE,
                       "trainer.total_steps=1")
    assert first.returncode == 0, first.stderr[-3000:]
    again = run_script("main_grpo.sh", *tiny_overrides(tiny_model_dir, resumed, manifest), *PIPELINE)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "resumed from" in (resumed / "train.log").read_text()
    picked = [[(r["sample_index"], r["dropped_by"], r["reward"]) for r in records(run, 2)] for run in (straight, resumed)]
    assert picked[0] == picked[1]
    assert metrics_lines(resumed)[2]["rollout/prompts"] == lines[2]["rollout/prompts"]
    assert no_server_left(marker)
