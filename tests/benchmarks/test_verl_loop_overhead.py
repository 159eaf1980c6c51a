"""benchmarks/verl_loop_overhead.py end to end at a tiny size: both loops run a step in verl's real V1 rollout
machinery (Ray, TransferQueue, AgentLoopWorkerTQ, RewardLoopWorker) and the line reports what each cost."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("verl", reason="verl is an extra: bash setup.sh --dev (verl-cpu)")
pytest.importorskip("ray")

ROOT = Path(__file__).resolve().parents[2]


def test_both_loops_finish_their_groups_and_their_cost_is_counted_by_process(tiny_model_dir):
    # the session's tiny model: the script would otherwise build the builtin one in the session's empty cache
    proc = subprocess.run([sys.executable, "benchmarks/verl_loop_overhead.py", "--prompts", "2", "--n", "2",
                           "--repeats", "1", "--workers", "1", "--model", str(tiny_model_dir)],
                          cwd=ROOT, capture_output=True, text=True, timeout=420)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = json.loads(proc.stdout.strip().splitlines()[-1])
    for loop in ("rl_factory", "verl_tool_agent"):
        out = line[loop]
        assert out["trajectories"] == 4 and out["median_s"] > 0
        # the scripted answer is right for the first prompt only (347 * 29): both loops' rewards score it alike
        assert out["reward_mean"] == 0.5
        assert out["cpu_s_per_step_by_process"].get("ray::AgentLoopWorkerTQ", 0) > 0
    # verl's loop calls its BaseTool in-process: no server process of its own (ours is an MCP stdio server, whose
    # CPU at this size can stay under the clock's 10 ms tick)
    assert "calculator server" not in line["verl_tool_agent"]["cpu_s_per_step_by_process"]
    assert line["ours_vs_verl"] > 0 and line["ours_vs_verl_cpu"] > 0
