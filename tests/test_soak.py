"""A small soak (benchmarks/soak.py): faulty servers, adversarial turns and flaky rewards together lose no
trajectory and leak no file descriptor or process. The full run (1,000 x 8) is a benchmark, not a test."""
import json
import subprocess
import sys
from pathlib import Path
import pytest

pytestmark = pytest.mark.slow  # benchmarks/soak.py: hundreds of rollouts against faulty servers

ROOT = Path(__file__).resolve().parents[1]


def test_a_small_soak_loses_nothing_and_leaks_nothing(tiny_model_dir):
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "soak.py"), "--trajectories", "24",
                          "--turns", "4", "--rounds", "3", "--concurrency", "12", "--adversarial", "0.15",
                          "--tokenizer", str(tiny_model_dir)],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["trajectories"] == 24 and result["lost_trajectories"] == 0 and result["exceptions"] == {}
    assert result["tool_calls"] > 40 and result["tool_errors"]  # faults were injected and counted
    # at most the two stdio servers (one may be between a crash and its restart when sampled)
    assert max(result["processes"]) <= 2 and result["fds"][-1] <= result["fds"][0] + 3
