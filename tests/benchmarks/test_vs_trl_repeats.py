"""benchmarks/vs_trl.py --repeats: same-seed runs compared for their results, and each step's time split into
what the work costs (slow in every run) and what the machine did (slow in one run, or a whole run slower)."""
from __future__ import annotations

from benchmarks.vs_trl import repeat_stats


def run(times, reward=0.5, tokens_per_s=100.0):
    lines = [{"step": 0, "val/accuracy": 0.0, "timing/val_s": 1.0}]
    for step, t in enumerate(times, start=1):
        lines.append({"step": step, "reward/mean": reward, "timing/step_s": t, "engine/tokens_per_s": tokens_per_s * t})
    return lines


def test_a_step_slow_in_every_run_is_the_works_and_one_slow_run_or_step_is_the_machines():
    work = run([1.0, 1.0, 1.0, 2.0, 1.0])             # step 4 carries more work
    spike = run([1.0, 1.0, 3.0, 2.0, 1.0])            # ... and the machine stalled at step 3 of this run
    slower = run([2.0, 2.0, 2.0, 4.0, 2.0], tokens_per_s=50.0)  # a run on a machine half as fast throughout
    stats = repeat_stats([work, spike, slower])
    assert stats["identical"] is True  # times and engine rates differ; every result is the same
    assert stats["spread"] == [2.0, 3.0, 2.0] and stats["slowest_step"] == [4, 3, 4]
    assert stats["median_s"] == [1.0, 1.0, 2.0]
    assert stats["work_spread"] == 2.0 and stats["work_slowest_step"] == 4


def test_runs_whose_results_differ_are_not_called_identical():
    assert repeat_stats([run([1.0, 1.0]), run([1.0, 1.0], reward=0.75)])["identical"] is False
