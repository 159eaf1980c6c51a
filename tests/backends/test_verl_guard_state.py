"""The run guard's state on verl: written into verl's checkpoint once the logger has checked its step, restored
on resume (pure: no verl import; verl's order of saving and logging as tests/backends/test_verl_run_dir.py plays it).

Steps 1 and 2 call a tool in every trajectory (the tool-rate baseline, `baseline_steps=2`); verl saves step 2's
checkpoint before logging it; the reward file is rewritten while the run is down; the resumed step 3 calls no
tool. The tool-rate collapse is judged against the saved baseline and the rewrite against the fingerprint the
first start took, whether the kill came after step 2's log or between verl's save and that log.
"""
import json

import pytest

from rl_factory.backends.verl.run_dir import RunDirLogger, write_part
from rl_factory.guard import GuardStop
from tests.backends.test_verl_run_dir import _checkpoint, _lines, _record

REWARD = "def reward(completion, **_):\n    return 1.0\n"


def _logger(run, reward, resume):
    ours = {"trainer": {"output_dir": str(run), "report": False, "guard": {"tools": {"baseline_steps": 2}}},
            "reward": {"success_threshold": 1.0, "function": f"{reward}:reward"}}
    return RunDirLogger({"rl_factory": ours, "trainer": {"resume_mode": "auto" if resume else "disable",
                                                         "default_local_dir": str(run / "checkpoints")}})


def _parts(run, step, calls):
    """Step `step`'s two scored rollouts lines with the agent loop's guard evidence (server version step - 1)."""
    lines = []
    for session in (0, 1):
        evidence = {"sample_index": 0, "engine": [], "trained": [], "versions": [step - 1], "weights": [None],
                    "generated_tokens": 5, "trained_tokens": 5, "tool_calls": calls, "parse_errors": 0,
                    "tool_errors": {"calculator": [calls, 0]} if calls else {}, "neg_logprob_sum": 5.0,
                    "neg_logprob_count": 5}
        lines.append({**_record(float(session), session), "guard": evidence})
    write_part(run, "train", step, lines)


@pytest.mark.parametrize("killed", ["after_log", "between_checkpoint_and_log"])
def test_a_resumed_verl_run_keeps_the_guards_baselines(tmp_path, killed):
    run = tmp_path / "run"
    run.mkdir()
    reward = tmp_path / "reward.py"
    reward.write_text(REWARD)
    first = _logger(run, reward, resume=False)
    _parts(run, 1, calls=1)
    first.log({"training/global_step": 1}, step=1)
    _parts(run, 2, calls=1)
    _checkpoint(run, 2)  # verl saves step 2 before it logs it
    (run / "checkpoints" / "global_step_2").mkdir()
    if killed == "after_log":
        first.log({"training/global_step": 2, "actor/entropy": 1.0}, step=2)
        assert json.loads((run / "checkpoints" / "global_step_2" / "guard_state.json").read_text())["step"] == 2
    first.finish()
    reward.write_text(REWARD + "# edited while the run was down\n")  # the fault, before the resume

    second = _logger(run, reward, resume=True)
    saved = json.loads((run / "checkpoints" / "global_step_2" / "guard_state.json").read_text())
    # killed before step 2's log: step 1's state (guard/state.json) and step 2 checked again from its rollouts
    assert saved["step"] == 2 and [s["call_rate"] for s in saved["checks"]["tools"]["seen"]] == [1.0, 1.0]
    assert str(reward.resolve()) in saved["checks"]["reward_files"]["start"]
    _parts(run, 3, calls=0)
    with pytest.raises(GuardStop) as stopped:
        second.log({"training/global_step": 3}, step=3)
    # killed before step 2's log, the rewrite happened before step 2 was checked: the resumed check of step 2
    # names it, and the run stops at its first log
    first_stop = 3 if killed == "after_log" else 2
    assert f"reward_files at step {first_stop}" in str(stopped.value)
    lines = _lines(run)
    assert [m["step"] for m in lines] == [1, 2, 3] and lines[1]["guard/tools/call_rate"] == 1.0
    assert lines[1]["guard/violations"] == (0 if killed == "after_log" else 1)
    three = lines[2]
    # the saved baseline, not a new one: a fresh guard would be collecting step 3 into its baseline
    assert three["guard/tools/call_rate/baseline"] == 1.0 and three["guard/tools/call_rate"] == 0.0
    assert three["guard/reward_files/changed"] == 1 and three["guard/violations"] == 2
    bundles = {p.name for p in (run / "guard").glob("step_*")}
    assert bundles >= {"step_000003_reward_files", "step_000003_tools"}
    assert ("step_000002_reward_files" in bundles) == (killed != "after_log")
