"""The CPU side of `gpu_suite.sh compare`: step end times read from a stamped verl log, and the summary
that says whether two jobs' measured steps overlapped on the GPU."""
import json
import subprocess
import sys
from pathlib import Path

from benchmarks.compare_loops import compare
from benchmarks.step_metrics import measured, step_ends

ROOT = Path(__file__).resolve().parents[2]


def _line(loop, launched, ends, step_s, tokens=10000.0):
    return {"bench": "gpu_step", "model": "tiny", "agent_loop": loop, "launched_unix": launched,
            "step_end_unix": {str(k): v for k, v in ends.items()}, "measured_steps": list(range(2, 1 + len(ends))),
            "step_s": step_s, "all_step_s": [3.0] * len(ends), "mean_turns": 2.0,
            "phases": {"generate": {"s": 1.0, "generated_tokens": None, "tokens_per_s": None},
                       "old_log_prob": {"s": 0.3, "tokens": tokens}}}


def test_step_ends_come_from_verls_stamped_console_lines(tmp_path):
    log = tmp_path / "bench_stdout.log"
    log.write_text("+   23.3s verl tuning: step:9 is not a metrics line\n"
                   "+  290.1s \x1b[36m(TaskRunnerV1 pid=9322)\x1b[0m step:1 - global_seqlen/min:9662.0 - x:1\n"
                   "+  292.9s (TaskRunnerV1 pid=9322) step:2 - global_seqlen/min:9000.0\n")
    assert step_ends(log, 1000.0) == {1: 1290.1, 2: 1292.9}
    lines = [{"step": s} for s in range(1, 8)]
    assert [m["step"] for m in measured(lines, 5)] == [2, 3, 4, 5]  # steps 6-7 ran under py-spy


def test_summary_flags_overlapping_measured_steps(tmp_path):
    ours = _line("rl_factory", 0.0, {1: 290.0, 2: 293.0, 3: 296.0}, step_s=3.0)
    later = _line("verl_tool_agent", 150.0, {1: 440.0, 2: 442.8, 3: 445.6}, step_s=2.8, tokens=11400.0)
    out = compare(ours, later)
    assert not out["measured_steps_overlap"] and out["ours_during_other_startup"]
    assert abs(out["step_ratio"] - 3.0 / 2.8) < 1e-9 and out["met"] is False  # 1.07 > 1.05
    assert abs(out["tokens_per_step_ratio"] - 10000 / 11400) < 1e-9
    early = _line("verl_tool_agent", 5.0, {1: 291.0, 2: 294.0, 3: 297.0}, step_s=3.0)
    assert compare(ours, early)["measured_steps_overlap"]
    # the script reads the last line of each file
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(ours) + "\n"), b.write_text("noise\n" + json.dumps(later) + "\n")
    proc = subprocess.run([sys.executable, "benchmarks/compare_loops.py", str(a), str(b)], cwd=ROOT,
                          capture_output=True, text=True, check=True)
    assert json.loads(proc.stdout)["step_ratio"] == out["step_ratio"]
