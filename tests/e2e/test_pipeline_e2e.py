"""The rollout pipeline through `bash main_grpo.sh`: filters, dynamic sampling and augmenters in a real run.

A run with `zero_variance`, dynamic sampling and `per_turn` views is stopped after step 1 and resumed to
step 2. Generation on CPU is not bit-reproducible from run to run, so how many rounds a step needs
can differ between two runs; what must hold is that every round draws the next prompts of the seeded
data order, across the resume too: steps 1 and 2 together drew exactly the first prompts of it.
"""
import re

import pytest

from rl_factory.data import PromptSampler, load_dataset
from tests.e2e.test_reward_e2e import data_with_ids
from tests.e2e.test_main_scripts import (REPO, marked_calculator_manifest, metrics_lines, no_server_left, run_script,
                                         tiny_overrides)
from tests.records import jsonl

pytestmark = pytest.mark.slow  # the launch scripts and training runs, end to end

PIPELINE = ["rollout.filters=[zero_variance]", "rollout.dynamic_sampling.min_groups=2",
            "rollout.dynamic_sampling.max_rounds=3", "rollout.augment=[per_turn]"]


def records(run, step):
    return jsonl(run / "rollouts" / f"step_{step:06d}.jsonl")


def test_filters_dynamic_sampling_and_views_in_a_run_that_resumes(tiny_model_dir, tmp_path):
    manifest, marker = marked_calculator_manifest(tmp_path)
    run = tmp_path / "run"
    first = run_script("main_grpo.sh", *tiny_overrides(tiny_model_dir, run, manifest), *PIPELINE,
                       "trainer.total_steps=1")
    assert first.returncode == 0, first.stderr[-3000:]
    again = run_script("main_grpo.sh", *tiny_overrides(tiny_model_dir, run, manifest), *PIPELINE)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "resumed from" in (run / "train.log").read_text()

    lines = metrics_lines(run)
    assert [m["step"] for m in lines] == [0, 1, 2]
    drawn = []
    for step in (1, 2):
        m, recs = lines[step], records(run, step)
        assert 1 <= m["rollout/rounds"] <= 3 and m["rollout/max_rounds_hit"] == float(m["rollout/groups"] < 2)
        assert len(recs) == 2 * m["rollout/prompts"]  # every generated trajectory is written, n = 2 each
        dropped = [r for r in recs if r["dropped_by"] is not None]
        assert len(dropped) == m["filter/zero_variance/dropped"]
        assert all(r["dropped_by"] == "zero_variance" and r["advantage"] is None for r in dropped)
        assert all(isinstance(r["advantage"], float) for r in recs if r["dropped_by"] is None)
        # each kept trajectory trains one sample per turn; dropped ones train nothing
        assert m["augment/per_turn/samples"] == sum(r["num_turns"] for r in recs if r["dropped_by"] is None)
        assert m.get("actor/samples", 0) == m["augment/per_turn/samples"]
        drawn += [r["sample_index"] for r in recs[::2]]  # the n rollouts of a prompt are written together

    rows = load_dataset(REPO / "examples" / "calculator" / "data" / "train.jsonl")
    assert drawn == PromptSampler(rows, 2, seed=0).next_indices(len(drawn))
    assert no_server_left(marker)


RAISING = ("def keep(completion, **_):\n    raise ValueError('cannot judge ' + repr(completion[:0]))\n\n"
           "def views(trajectory, spans, **_):\n    raise ValueError('no views today')\n")


@pytest.mark.parametrize("stage, entry, message", [
    ("rollout.filters", "user_pipeline.py:keep", "ValueError: cannot judge ''"),
    ("rollout.augment", "user_pipeline.py:views", "ValueError: no views today"),
], ids=["filter", "augmenter"])
def test_a_raising_user_filter_or_augmenter_is_one_line_naming_the_sample(stage, entry, message, tiny_model_dir,
                                                                         tmp_path):
    manifest, marker = marked_calculator_manifest(tmp_path)
    (tmp_path / "user_pipeline.py").write_text(RAISING)
    data, rows = data_with_ids(tmp_path)
    result = run_script("main_grpo.sh", *tiny_overrides(tiny_model_dir, tmp_path / "run", manifest),
                        f"data.train_files={data}", f"data.val_files={data}", "data.val_limit=1",
                        "rollout.max_response_tokens=4", f"{stage}=[{tmp_path / entry}]")
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and len(errors[0]) < 500, result.stderr[-3000:]
    for text in (f"{stage}[0] (user_pipeline.py:{entry.rpartition(':')[2]})", "failed: " + message):
        assert text in errors[0], (text, errors[0])
    sample = re.search(r" on sample (\d+) \(id 'calc-(\d+)'\) \(prompt: '([^']*)", errors[0])
    assert sample and sample.group(1) == sample.group(2), errors[0]
    assert rows[int(sample.group(1))]["prompt"].startswith(sample.group(3)[:20])
    assert no_server_left(marker)
