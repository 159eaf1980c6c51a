"""Files written from model or tool text survive text that is not Unicode: a lone surrogate (a Python
tool's undecodable bytes, kept by the rollouts writer as its JSON escape) must not fail the write.
(Rollouts: tests/envs/test_tool_limits.py, tests/backends/test_verl_run_dir.py; report.html:
tests/report/test_report.py.)"""
import csv

from rl_factory.rescore import _write
from tests.report.conftest import make_traj


def test_rescore_table_keeps_a_completion_with_a_lone_surrogate(tmp_path):
    traj = make_traj(3, "caf\udce9", 1.0)
    summary = _write(tmp_path, [("train", 1, {"id": "a"})], [traj], [0.0], "mine")
    with (tmp_path / "rescore.csv").open(newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert summary["trajectories"] == 1 and rows[0]["new_reward"] == "1.0"
    assert "caf\\udce9" in rows[0]["completion"]  # escaped, the rest of the text intact
