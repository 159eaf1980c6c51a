"""benchmarks/old_log_prob_call.py at a tiny size: verl's old-log-prob call runs three ways on a real V1 rollout
step, and each way's worker receives the fields that way names."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("verl", reason="verl is an extra: bash setup.sh --dev (verl-cpu)")
pytest.importorskip("ray")

ROOT = Path(__file__).resolve().parents[2]


def test_three_ways_each_timed_in_parts(tiny_model_dir):
    from rl_factory.backends.verl.fetch import FORWARD_UNREAD, UNREAD

    proc = subprocess.run([sys.executable, "benchmarks/old_log_prob_call.py", "--prompts", "2", "--n", "2",
                           "--repeats", "2", "--workers", "1", "--model", str(tiny_model_dir)],
                          cwd=ROOT, capture_output=True, text=True, timeout=420)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = json.loads(proc.stdout.strip().splitlines()[-1])
    assert line["trajectories"] == 4
    fields = {way: set(line[way]["worker_fields"]) for way in ("all", "common_unread", "needed")}
    assert UNREAD & fields["all"] and not UNREAD & fields["common_unread"]
    assert fields["common_unread"] - fields["needed"] == FORWARD_UNREAD & fields["all"] != set()
    for way in fields:
        parts = {k: v for k, v in line[way].items() if k.endswith("_ms") and k != "call_ms"}
        assert len(line[way]["call_ms_all"]) == 2 and line[way]["call_ms"] > 0
        assert parts["worker_fetch_ms"] > 0 and parts["trainer_get_ms"] > 0 and parts["other_ms"] >= 0
        assert sum(parts.values()) == pytest.approx(line[way]["call_ms"], rel=0.2)
