"""The guard's checks on hand-made steps: what fires, what does not, and the evidence they read.

Each check is a pure function of JSON (a step's metrics and evidence records) and its own state, so these
run without a model; tests/guard/test_faults.py makes the same checks fire inside real runs.
"""
from __future__ import annotations

import json
import math

from rl_factory.guard import Guard, GuardConfig, guard_config
from rl_factory.guard.checks.logprobs import LogprobGapCheck, LogprobGapConfig
from rl_factory.guard.checks.receipts import ReceiptsCheck, ReceiptsConfig
from rl_factory.guard.fingerprint import weight_fingerprint
from rl_factory.guard.checks.rewards import RewardFilesCheck, RewardFilesConfig, RewardRangeCheck, RewardRangeConfig
from rl_factory.guard.checks.tokens import TokensCheck, TokensConfig
from rl_factory.guard.checks.tools import RewardWithoutToolsCheck, RewardWithoutToolsConfig, ToolsCheck, ToolsConfig
from rl_factory.guard.evidence import digest, mask_runs, receipt, trajectory_evidence
from rl_factory.guard.registry import CHECKS, StepData
from rl_factory.types import Step, Trajectory, Turn


def make_traj(turn_ids: list[list[int]], obs: list[int] = (9, 9), steps: bool = False) -> Trajectory:
    """A trajectory of generated turns with receipts, as the rollout appends them (prompt [1, 2])."""
    ids, mask, turns = [1, 2], [0, 0], []
    for k, gen in enumerate(turn_ids):
        turns.append(Turn(gen, [-0.5] * len(gen), "t", receipt=receipt(gen, 3, "w3")))
        ids += gen
        mask += [1] * len(gen)
        if k < len(turn_ids) - 1:
            ids += list(obs)
            mask += [0] * len(obs)
    traj = Trajectory(0, [1, 2], ids, mask, [0.0] * len(ids), [], turns, "answer", reward=1.0)
    if steps:  # the step context policy: each turn its own sample
        traj.steps = [Step([1, 2, *g], [0, 0] + [1] * len(g), [0.0] * (len(g) + 2)) for g in turn_ids]
    return traj


def test_mask_runs_and_evidence_of_a_faithful_trajectory():
    assert mask_runs([5, 6, 7, 8, 9], [0, 1, 1, 0, 1]) == [[6, 7], [9]]
    for steps in (False, True):
        ev = trajectory_evidence(make_traj([[4, 5, 0], [6, 0]], steps=steps))
        assert ev["engine"] == ev["trained"] == [digest([4, 5, 0]), digest([6, 0])]
        assert ev["versions"] == [3, 3] and ev["generated_tokens"] == ev["trained_tokens"] == 5
        _, finding = TokensCheck(TokensConfig()).evaluate(StepData(1, trajectories=[ev]))
        assert finding is None


def test_tokens_fire_on_retokenized_ids_and_on_a_mask_that_misses_a_turn():
    changed = make_traj([[4, 5, 0], [6, 0]])
    changed.token_ids[3] = 77  # a generated id replaced after sampling
    metrics, finding = TokensCheck(TokensConfig()).evaluate(StepData(4, trajectories=[trajectory_evidence(changed)]))
    assert metrics["guard/tokens/mismatched"] == 1 and "train ids never sampled" in finding.line()
    unmasked = make_traj([[4, 5, 0], [6, 0]])
    unmasked.loss_mask[-2:] = [0, 0]  # the second turn left out of the loss
    metrics, finding = TokensCheck(TokensConfig()).evaluate(StepData(4, trajectories=[trajectory_evidence(unmasked)]))
    assert metrics["guard/tokens/uncovered"] == 1 and "leave sampled ids untrained" in finding.message
    no_receipt = make_traj([[4]])
    no_receipt.turns[0].receipt = None  # a scripted engine: counted, never judged
    metrics, finding = TokensCheck(TokensConfig()).evaluate(StepData(4, trajectories=[trajectory_evidence(no_receipt)]))
    assert finding is None and metrics["guard/tokens/unreceipted"] == 1


def test_receipts_expect_the_previous_version_and_its_weights():
    ev = trajectory_evidence(make_traj([[4, 0]]))  # version 3, weights "w3"
    check = ReceiptsCheck(ReceiptsConfig())
    assert check.evaluate(StepData(4, trajectories=[ev], expected={"version": 3, "weights": {"3": "w3"}}))[1] is None
    _, finding = check.evaluate(StepData(4, trajectories=[ev], expected={"version": 3, "weights": {"3": "w9"}}))
    assert "generated with weights w3 at version 3" in finding.message
    _, finding = check.evaluate(StepData(5, trajectories=[ev], expected={"version": 4}))
    assert "version(s) [3]" in finding.message and "did not reach the engine" in finding.message
    lagging = ReceiptsCheck(ReceiptsConfig(max_staleness=1))
    assert lagging.evaluate(StepData(5, trajectories=[ev], expected={"version": 4}))[1] is None


def test_weight_fingerprint_moves_with_any_weight():
    import torch

    model = torch.nn.Linear(4, 3)
    before = weight_fingerprint(model)
    assert weight_fingerprint(model) == before
    with torch.no_grad():
        model.bias[1] += 1e-6
    assert weight_fingerprint(model) != before


def test_logprob_gap_fires_on_a_jump_past_its_baseline():
    check = LogprobGapCheck(LogprobGapConfig(baseline_steps=2, max_ratio=10, min_jump=0.05))
    for step, gap in enumerate([1e-6, 2e-6, 1e-5, 0.04], start=1):  # small wobbles stay under min_jump
        assert check.evaluate(StepData(step, metrics={"actor/logprob_gap": gap}))[1] is None
    metrics, finding = check.evaluate(StepData(5, metrics={"actor/logprob_gap": 0.3}))
    assert metrics["guard/logprob_gap/baseline"] == 1.5e-6 and "numerics gap" in finding.message
    # verl's diff metric stands in for ours
    verl = LogprobGapCheck(LogprobGapConfig(baseline_steps=1))
    verl.evaluate(StepData(1, metrics={"training/rollout_probs_diff_mean": 0.002}))
    assert verl.evaluate(StepData(2, metrics={"training/rollout_probs_diff_mean": 0.2}))[1] is not None


def _tool_ev(calls: int, parse: int = 0, errors: int = 0, reward: float = 0.0) -> dict:
    return {"tool_calls": calls, "parse_errors": parse, "reward": reward,
            "tool_errors": {"calculator": [calls - parse, errors]} if calls - parse else {}}


def test_tools_fire_when_calls_stop_or_fail_against_the_baseline():
    check = ToolsCheck(ToolsConfig(baseline_steps=2, min_calls=2), {"has_tools": True, "doctor": {"ok": True}})
    for step in (1, 2):
        assert check.evaluate(StepData(step, trajectories=[_tool_ev(1), _tool_ev(1), _tool_ev(0)]))[1] is None
    _, finding = check.evaluate(StepData(3, trajectories=[_tool_ev(0)] * 3))
    assert "tool-call rate 0 fell under" in finding.message
    _, finding = check.evaluate(StepData(4, trajectories=[_tool_ev(2, errors=2)] * 3))
    assert "tool calculator: error rate 1" in finding.message
    _, finding = check.evaluate(StepData(5, trajectories=[_tool_ev(2, parse=2)] * 3))
    assert "parse-failure rate 1" in finding.message
    # a run without tools has no tool baseline to fall from
    quiet = ToolsCheck(ToolsConfig(baseline_steps=0), {"has_tools": False})
    assert quiet.evaluate(StepData(1, trajectories=[_tool_ev(0)]))[1] is None


def test_reward_rising_while_no_tool_is_called():
    check = RewardWithoutToolsCheck(RewardWithoutToolsConfig(baseline_steps=1, steps=2), {"has_tools": True})
    check.evaluate(StepData(1, trajectories=[_tool_ev(1, reward=0.0)]))
    assert check.evaluate(StepData(2, trajectories=[_tool_ev(0, reward=0.5)]))[1] is None
    assert check.evaluate(StepData(3, trajectories=[_tool_ev(1, reward=0.6)]))[1] is None  # a call resets it
    check.evaluate(StepData(4, trajectories=[_tool_ev(0, reward=0.5)]))
    _, finding = check.evaluate(StepData(5, trajectories=[_tool_ev(0, reward=0.7)]))
    assert "no tool was called for 2 steps in a row" in finding.message


def test_reward_range_and_non_finite_rewards():
    check = RewardRangeCheck(RewardRangeConfig(min=0.0, max=1.0))
    inside = [{"reward": 0.5, "reward_finite": True}, {"reward": None, "reward_finite": True}]
    assert check.evaluate(StepData(1, trajectories=inside))[1] is None
    _, finding = check.evaluate(StepData(2, trajectories=[{"reward": 1.5, "reward_finite": True, "sample_index": 7}]))
    assert "sample 7 got 1.5" in finding.message
    traj = make_traj([[4]])
    traj.reward = math.nan
    _, finding = RewardRangeCheck(RewardRangeConfig()).evaluate(StepData(3, trajectories=[trajectory_evidence(traj)]))
    assert "non-finite" in finding.message


def test_files_are_fingerprinted_when_the_guard_starts(tmp_path):
    reward = tmp_path / "r.py"
    reward.write_text("def reward(completion, **_):\n    return 0.0\n")
    data = tmp_path / "train.jsonl"
    data.write_text('{"prompt": "a"}\n')
    guard = Guard(GuardConfig(), tmp_path / "run", {"reward": {"function": f"{reward}:reward"},
                                                    "data": {"train_files": str(data)}})
    assert guard.check(StepData(1), lambda _: [])["guard/reward_files/changed"] == 0
    reward.write_text("def reward(completion, **_):\n    return 1.0\n")
    metrics = guard.check(StepData(2), lambda _: [])
    assert metrics["guard/reward_files/changed"] == 1 and metrics["guard/violations"] == 1
    finding = json.loads(next((tmp_path / "run" / "guard").glob("step_000002_reward_files/finding.json")).read_text())
    assert finding["action"] == "stop" and str(reward.resolve()) in finding["message"]
    # the report's guard section lists it
    from rl_factory.report import render_report

    (tmp_path / "run" / "metrics.jsonl").write_text('{"step": 1, "reward/mean": 0.0}\n')
    page = render_report([tmp_path / "run"])
    assert 'id="guard-section"' in page and "reward_files" in page and "step_000002_reward_files" in page
    assert RewardFilesCheck(RewardFilesConfig(), {"start": {"x": "1"}}).evaluate(StepData(1, files={"x": "1"}))[1] is None


def test_every_check_has_its_config_slice_and_off_removes_it(tmp_path):
    cfg = GuardConfig()
    assert all(hasattr(cfg, name) for name in CHECKS)
    off = guard_config({"trainer": {"guard": {"tokens": {"action": "off"}}}})
    assert "tokens" not in [c.name for c in Guard(off, tmp_path, {}).checks]


def test_guard_settings_do_not_make_another_run():
    from rl_factory.fingerprint import fingerprint, run_view

    base = {"trainer": {"backend": "embedded", "guard": {"tokens": {"action": "stop"}}}, "optim": {"lr": 1e-3}}
    changed = {"trainer": {"backend": "embedded", "guard": {"tokens": {"action": "warn"}}}, "optim": {"lr": 1e-3}}
    assert fingerprint(run_view(base)) == fingerprint(run_view(changed))
    assert fingerprint(run_view(base)) != fingerprint(run_view({**base, "optim": {"lr": 1e-4}}))


def test_the_guards_state_round_trips_through_json_into_a_fresh_guard(tmp_path):
    reward = tmp_path / "r.py"
    reward.write_text("def reward(completion, **_):\n    return 0.0\n")
    config = {"reward": {"function": f"{reward}:reward"}}
    guard = Guard(guard_config({"trainer": {"guard": {"tools": {"baseline_steps": 2}}}}), tmp_path / "run", config,
                  {"tools": {"has_tools": True}})
    guard.fingerprints = {"2": "abc"}
    for step, calls in ((1, 1), (2, 1), (3, 0)):
        guard.check(StepData(step, metrics={"actor/logprob_gap": 0.01 * step},
                             trajectories=[_tool_ev(calls, reward=1.0)] * 2), lambda _: [])
    saved = json.loads(json.dumps(guard.state_dict()))  # JSON, as the checkpoint holds it
    assert saved["step"] == 3 and saved["fingerprints"] == {"2": "abc"} and len(saved["window"]) == 3
    assert set(saved["checks"]) == {c.name for c in guard.checks}
    reward.write_text("def reward(completion, **_):\n    return 1.0\n")  # changed before the resume
    resumed = Guard(guard_config({"trainer": {"guard": {"tools": {"baseline_steps": 2}}}}), tmp_path / "run", config)
    resumed.load_state_dict(saved)
    assert resumed.state_dict() == saved
    metrics = resumed.check(StepData(4, trajectories=[_tool_ev(0, reward=1.0)] * 2), lambda _: [])
    assert metrics["guard/tools/call_rate/baseline"] == 1.0 and metrics["guard/reward_files/changed"] == 1
    assert metrics["guard/reward_constant/streak"] == 4  # the streak goes on from the saved 3
    try:
        resumed.load_state_dict({**saved, "format": 99})
    except ValueError as exc:
        assert "format 99" in str(exc)
    else:
        raise AssertionError("a state of another format loaded")


def test_receipts_name_an_adapter_state_apart_from_the_trainers_and_weights_that_did_not_resume():
    ev = trajectory_evidence(make_traj([[4, 0]]))
    ev["weights"] = ["aa+lora0/28.1e18086b"]  # the trainer's tensors, every adapter layer disabled
    check = ReceiptsCheck(ReceiptsConfig())
    _, finding = check.evaluate(StepData(4, trajectories=[ev], expected={"version": 3,
                                                                          "weights": {"3": "aa+lora28/28.c91d911c"}}))
    assert "LoRA adapter disabled" in finding.message and "0 of 28 adapter layers enabled" in finding.message
    ev["weights"] = ["bb+lora28/28.c91d911c"]
    _, finding = check.evaluate(StepData(4, trajectories=[ev], expected={
        "version": 3, "weights": {"3": "aa+lora28/28.c91d911c"},
        "resumed": {"version": 3, "saved": "aa+lora28/28.c91d911c", "loaded": "bb+lora28/28.c91d911c"}}))
    assert "loaded back on resume" in finding.message


def test_a_lora_fingerprint_holds_the_adapters_state():
    import torch
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(torch.nn.Sequential(torch.nn.Linear(4, 4)), LoraConfig(r=2, target_modules=["0"]))
    on = weight_fingerprint(model)
    assert "+lora1/1." in on
    with model.disable_adapter():
        off = weight_fingerprint(model)
    assert off.split("+")[0] == on.split("+")[0] and "+lora0/1." in off and weight_fingerprint(model) == on
