"""benchmarks/verl_loop_overhead.py end to end at a tiny size: both loops run a step in verl's real V1 rollout
machinery (Ray, TransferQueue, AgentLoopWorkerTQ as our launcher starts it, RewardLoopWorker) and the line reports
what each cost; and
benchmarks/old_log_prob_call.py, which times verl's old-log-prob call on such a step."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # the verl loop-overhead benchmark's runs (~40 s)

pytest.importorskip("verl", reason="verl is an extra: bash setup.sh --dev (verl-cpu)")
pytest.importorskip("ray")

ROOT = Path(__file__).resolve().parents[2]


def bench(script: str, model: Path, repeats: int) -> dict:
    """The JSON line of benchmarks/`script` on 2 prompts x 2, one worker each."""
    # the session's tiny model: the script would otherwise build the builtin one in the session's empty cache
    proc = subprocess.run([sys.executable, f"benchmarks/{script}", "--prompts", "2", "--n", "2",
                           "--repeats", str(repeats), "--workers", "1", "--model", str(model)],
                          cwd=ROOT, capture_output=True, text=True, timeout=420)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_both_loops_finish_their_groups_and_their_cost_is_counted_by_process(tiny_model_dir):
    line = bench("verl_loop_overhead.py", tiny_model_dir, 1)
    for loop in ("rl_factory", "verl_tool_agent"):
        out = line[loop]
        assert out["trajectories"] == 4 and out["median_s"] > 0
        # the scripted answer is right for the first prompt only (347 * 29): both loops' rewards score it alike
        assert out["reward_mean"] == 0.5
        assert out["cpu_s_per_step_by_process"].get("ray::AgentLoopWorkerPrestarted", 0) > 0  # prestart.py's
    # verl's loop calls its BaseTool in-process: no server process of its own (ours is an MCP stdio server, whose
    # CPU at this size can stay under the clock's 10 ms tick)
    assert "calculator server" not in line["verl_tool_agent"]["cpu_s_per_step_by_process"]
    # on the workers a run uses (prestart.py): when our trajectories began and sent their first requests
    timing = line["rl_factory"]["timing"]
    assert line["workers_from"] == "prestart"
    assert 0 <= timing["trajectory_starts_in_worker_s"] <= timing["trajectory_starts_s"]
    assert 0 <= timing["request_starts_s"] and 0 <= timing["before_first_request_s"] <= timing["slowest_trajectory_s"]
    assert line["ours_vs_verl"] > 0 and line["ours_vs_verl_cpu"] > 0


def test_old_log_prob_call_times_three_ways_in_parts(tiny_model_dir):
    from rl_factory.backends.verl.fetch import FORWARD_UNREAD, UNREAD

    line = bench("old_log_prob_call.py", tiny_model_dir, 2)
    assert line["trajectories"] == 4
    # each way's worker received the fields that way names
    fields = {way: set(line[way]["worker_fields"]) for way in ("all", "common_unread", "needed")}
    assert UNREAD & fields["all"] and not UNREAD & fields["common_unread"]
    assert fields["common_unread"] - fields["needed"] == FORWARD_UNREAD & fields["all"] != set()
    for way in fields:
        parts = {k: v for k, v in line[way].items() if k.endswith("_ms") and k != "call_ms"}
        assert len(line[way]["call_ms_all"]) == 2 and line[way]["call_ms"] > 0
        assert parts["worker_fetch_ms"] > 0 and parts["trainer_get_ms"] > 0 and parts["other_ms"] >= 0
        assert sum(parts.values()) == pytest.approx(line[way]["call_ms"], rel=0.2)
