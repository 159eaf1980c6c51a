"""ArenaRL end to end: `bash main_grpo.sh algorithm.advantage=arena ...` with the reward-comparator judge."""
import csv

import pytest

from tests.e2e.test_main_scripts import (calculator_pids, marked_calculator_manifest, metrics_lines, no_server_left,
                                         run_script, tiny_overrides)
from tests.records import jsonl

pytestmark = pytest.mark.slow  # the launch scripts and training runs, end to end

N = 4  # rollouts per prompt: a round robin of 6 matches per group


def test_arena_round_robin_run(tiny_model_dir, tmp_path):
    manifest, marker = marked_calculator_manifest(tmp_path)
    run = tmp_path / "run"
    result = run_script("main_grpo.sh", *tiny_overrides(tiny_model_dir, run, manifest), f"rollout.n={N}",
                        "algorithm.advantage=arena", "algorithm.arena.topology=round_robin")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Traceback" not in result.stderr

    lines = metrics_lines(run)
    assert [m["step"] for m in lines] == [0, 1, 2]
    for m in lines[1:]:
        assert m["arena/judge_calls"] == 2 * N * (N - 1) / 2  # two groups per step
        assert m["arena/judge_failures"] == 0 and m["arena/skipped_groups"] == 0
        assert 0 <= m["arena/ties"] <= m["arena/judge_calls"]
        if "arena/reward_spearman" in m:  # only when some group's rewards differ
            assert m["arena/reward_spearman"] > 0.99  # the judge compares exactly those rewards

    with (run / "rankings.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == ["step", "group", "prompt", "rollout", "matches", "wins", "losses", "rank", "score"]
    assert len(rows) == 2 * 2 * N  # steps * groups * rollouts
    for step in (1, 2):
        records = jsonl(run / "rollouts" / f"step_{step:06d}.jsonl")
        for group in (0, 1):
            ranked = [r for r in rows if r["step"] == str(step) and r["group"] == str(group)]
            trajs = records[group * N:(group + 1) * N]
            assert [int(r["rollout"]) for r in ranked] == list(range(N))
            assert {int(r["prompt"]) for r in ranked} == {t["sample_index"] for t in trajs}
            assert all(int(r["matches"]) == N - 1 for r in ranked)
            assert sum(float(r["score"]) for r in ranked) == pytest.approx(N / 2)
            assert sum(t["advantage"] for t in trajs) == pytest.approx(0, abs=1e-5)
            for a, ta in zip(ranked, trajs):
                for b, tb in zip(ranked, trajs):
                    if ta["reward"] > tb["reward"]:  # the reward comparator: a higher reward wins
                        assert float(a["score"]) > float(b["score"]) and ta["advantage"] > tb["advantage"]
                        assert int(a["rank"]) < int(b["rank"])
    assert no_server_left(marker), calculator_pids(marker)


@pytest.mark.parametrize("topology, anchor, calls_per_group", [
    ("single_elimination", "greedy", N + (N - 1)),  # seeding against one extra greedy rollout, then a bracket
    ("anchor", "reference", N),  # every rollout against the dataset's answer
])
def test_arena_outside_anchors(tiny_model_dir, tmp_path, topology, anchor, calls_per_group):
    manifest, marker = marked_calculator_manifest(tmp_path)
    run = tmp_path / "run"
    result = run_script("main_grpo.sh", *tiny_overrides(tiny_model_dir, run, manifest), f"rollout.n={N}",
                        "trainer.total_steps=1", "algorithm.advantage=arena", f"algorithm.arena.topology={topology}",
                        f"algorithm.arena.anchor={anchor}")
    assert result.returncode == 0, result.stderr[-3000:]
    step = metrics_lines(run)[1]
    assert step["arena/judge_calls"] == 2 * calls_per_group
    with (run / "rankings.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 2 * N and {r["rank"] for r in rows} >= {"1"}
    assert no_server_left(marker), calculator_pids(marker)


@pytest.mark.parametrize("overrides, expected", [
    (["algorithm.advantage=arena", "algorithm.arena.topology=swis"], ["unknown tournament topology 'swis'",
                                                                       "round_robin"]),
    (["algorithm.advantage=arena", "algorithm.arena.judge.type=gpt"], ["unknown judge type 'gpt'"]),
    # gae trains a critic over one token sequence per trajectory: the step context policy is refused.
    (["algorithm.advantage=gae", "rollout.context=step"],
     ["algorithm.advantage=gae is not supported on any backend with rollout.context=step", "use rollout.context=append"]),
])
def test_arena_config_errors_fail_fast(tiny_model_dir, tmp_path, overrides, expected):
    manifest, marker = marked_calculator_manifest(tmp_path)
    result = run_script("main_grpo.sh", *tiny_overrides(tiny_model_dir, tmp_path / "run", manifest), *overrides)
    assert result.returncode == 2, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    for text in expected:
        assert text in errors[0], (text, errors[0])
    assert not calculator_pids(marker)  # failed before any server started
