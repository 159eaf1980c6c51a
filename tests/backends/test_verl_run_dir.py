"""Our run directory on verl from the lines verl's workers write (pure: no verl import).

tool/* counters, and a resumed run's metrics.jsonl: each step once, whatever the kill interrupted.
"""
import json
import re

import pytest

from rl_factory.backends.verl.run_dir import RunDirLogger, tool_counts, write_part
from tests.records import jsonl


def _line(*results):
    return {"tool_results": [{"name": n, "error_kind": k, "latency_s": 0.01} for n, k in results]}


def test_garbled_calls_are_pooled_not_keyed_by_whatever_name_the_model_wrote():
    # seen on the H200: parse errors with an empty name produced `tool//calls` and `tool//errors/parse`
    lines = [_line(("calculator", None), ("", "parse"), ("calculator", "parse")),
             _line(("nonsense<x", "parse"), ("search", "unknown_tool"))]
    counts = tool_counts(lines)
    assert counts["tool/calls"] == 5
    assert counts["tool/calculator/calls"] == 2 and counts["tool/calculator/errors/parse"] == 1
    assert counts["tool/_invalid/calls"] == 3 and counts["tool/_invalid/errors/parse"] == 2
    assert counts["tool/_invalid/errors/unknown_tool"] == 1
    assert not [k for k in counts if k.startswith("tool//") or "nonsense" in k or "search" in k]


def test_the_manifest_names_decide_when_given():
    counts = tool_counts([_line(("calculator", "parse"))], tool_names={"calculator"})
    assert counts["tool/calculator/errors/parse"] == 1


# ---- resume: verl saves step k before logging it, and re-validates step k after restoring it ----

def _record(reward, session=0):
    return {"sample_index": 0, "session": session, "reward": reward, "num_turns": 2, "generated_tokens": 5,
            "total_tokens": 20, "prompt_tokens": 15, "stop_reason": "stop", "tool_calls": [{"name": "calculator"}],
            "tool_results": [{"name": "calculator", "error_kind": None, "latency_s": 0.01}]}


def _logger(run, resume=True):
    config = {"rl_factory": {"trainer": {"output_dir": str(run), "report": False}, "reward": {"success_threshold": 1.0}},
              "trainer": {"resume_mode": "auto" if resume else "disable", "default_local_dir": str(run / "checkpoints")}}
    return RunDirLogger(config)


def _step(logger, run, step, reward, val=False):
    write_part(run, "train", step, [_record(reward), _record(reward, 1)])
    data = {"timing_s/step": 1.0, "training/global_step": step}
    if val:
        write_part(run, "val", step, [_record(1.0)])
        data["val-core/rl_factory/reward/mean@1"] = 1.0
    logger.log(data, step=step)


def _checkpoint(run, step):
    (run / "checkpoints").mkdir(exist_ok=True)
    (run / "checkpoints" / "latest_checkpointed_iteration.txt").write_text(str(step))


def _lines(run):
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("killed", ["after_log", "between_checkpoint_and_log", "in_the_next_step"])
def test_a_resumed_run_keeps_each_step_once(tmp_path, killed):
    """Steps 1-2 logged, checkpoint at 3; the kill lands after step 3's line, before it, or in step 4."""
    run = tmp_path
    first = _logger(run, resume=False)
    write_part(run, "val", 0, [_record(0.0)])
    first.log({"val-core/rl_factory/reward/mean@1": 0.0}, step=0)
    _step(first, run, 1, 0.0)
    _step(first, run, 2, 1.0)
    _checkpoint(run, 3)
    write_part(run, "train", 3, [_record(1.0), _record(0.0, 1)])  # step 3's rollouts are scored...
    if killed != "between_checkpoint_and_log":
        first.log({"timing_s/step": 1.0, "training/global_step": 3}, step=3)
    if killed == "in_the_next_step":  # ...step 4 half done: some parts, its arena rows
        write_part(run, "train", 4, [_record(0.0)])
        (run / "arena" / "host-1").mkdir(parents=True)
        (run / "arena" / "host-1" / "rankings.csv").write_text(
            "step,group,prompt,rollout,matches,wins,losses,rank,score\n3,u3,0,0,1,1,0,1,1.0\n4,u4,0,0,1,1,0,1,1.0\n")
        (run / "arena" / "host-1" / "metrics.jsonl").write_text('{"step": 3, "uid": "u3"}\n{"step": 4, "uid": "u4"}\n')
    write_part(run, "val", 3, [_record(0.0)])  # a validation of step 3 the kill cut short
    first.jsonl.close()

    second = _logger(run)  # the restarted job: verl restored step 3
    write_part(run, "val", 3, [_record(1.0)])  # val_before_train on the restored weights, logged at step 3
    second.log({"val-core/rl_factory/reward/mean@1": 1.0}, step=3)
    _step(second, run, 4, 1.0)
    _step(second, run, 5, 1.0, val=True)
    second.finish()

    lines = _lines(run)
    assert [m["step"] for m in lines] == [0, 1, 2, 3, 4, 5]
    three = lines[3]
    assert three["reward/mean"] == 0.5 and three["val/reward/mean"] == 1.0  # its rollouts, the re-validation
    assert ("timing/step_s" in three) == (killed != "between_checkpoint_and_log")  # verl's lost with the kill
    assert lines[4]["reward/mean"] == 1.0 and lines[4]["tool/calls"] == 2  # the half-done step 4 is gone
    assert len(jsonl(run / "rollouts" / "step_000004.jsonl")) == 2
    assert len(jsonl(run / "rollouts" / "step_000003.jsonl")) == 2
    assert not list((run / "rollouts" / ".parts").iterdir())
    if killed == "in_the_next_step":
        assert (run / "arena" / "host-1" / "rankings.csv").read_text().splitlines()[1:] == ["3,u3,0,0,1,1,0,1,1.0"]
        assert (run / "arena" / "host-1" / "metrics.jsonl").read_text() == '{"step": 3, "uid": "u3"}\n'


def test_a_resumed_validation_adds_to_its_step_and_changes_nothing_it_had(tmp_path):
    run = tmp_path
    first = _logger(run, resume=False)
    _step(first, run, 1, 0.0, val=True)  # step 1 validated (val/reward/mean 1.0) and saved
    _checkpoint(run, 1)
    first.jsonl.close()
    second = _logger(run)
    write_part(run, "val", 1, [_record(0.0)])
    second.log({"val-core/rl_factory/reward/mean@1": 0.0, "val-aux/extra": 2.0}, step=1)
    second.finish()
    (line,) = _lines(run)
    assert line["step"] == 1 and line["val/reward/mean"] == 1.0 and line["val-aux/extra"] == 2.0


# ---- model text in rollouts: characters str.splitlines() breaks on ----

# what str.splitlines() breaks at: the first three stay raw under json.dumps(ensure_ascii=False), the rest are escaped
LINE_BREAKERS = "\u2028\u2029\x85\x0b\x0c\x1c\x1d\x1e"


def test_rollouts_whose_text_holds_unicode_line_breaks_are_gathered_whole(tmp_path, caplog):
    # seen on the H200 (2026-12-02): a random-init 4B model's first step wrote such characters and the
    # run died in json.loads while logging step 1
    records = [{**_record(0.0, session), "final_text": f"x{ch}y {ch}", "tool_calls": [{"name": f"c{ch}"}]}
               for session, ch in enumerate(LINE_BREAKERS)]
    for i in range(0, len(records), 3):  # several writes, as trajectories finish one by one
        write_part(tmp_path, "train", 1, records[i:i + 3])
    part = next((tmp_path / "rollouts" / ".parts" / "train_step_000001").glob("*.jsonl"))
    assert len(part.read_text(encoding="utf-8").splitlines()) > len(records)  # what str.splitlines() would see
    logger = _logger(tmp_path, resume=False)
    logger.log({"timing_s/step": 1.0}, step=1)
    kept = [json.loads(x) for x in (tmp_path / "rollouts" / "step_000001.jsonl").read_text(encoding="utf-8").split("\n") if x]
    assert [r["final_text"] for r in kept] == [r["final_text"] for r in records]
    line = json.loads((tmp_path / "metrics.jsonl").read_text(encoding="utf-8"))
    assert line["tool/calls"] == len(records) and not caplog.records


def test_a_torn_line_from_a_killed_worker_costs_that_line_only(tmp_path, caplog):
    write_part(tmp_path, "train", 1, [_record(1.0), _record(0.0, 1)])
    (tmp_path / "rollouts" / ".parts" / "train_step_000001" / "other-1.jsonl").write_text(
        json.dumps(_record(1.0, 2)) + "\n" + json.dumps(_record(1.0, 3))[:40], encoding="utf-8")
    logger = _logger(tmp_path, resume=False)
    logger.log({"timing_s/step": 1.0}, step=1)
    kept = jsonl(tmp_path / "rollouts" / "step_000001.jsonl")
    assert sorted(r["session"] for r in kept) == [0, 1, 2]
    assert "other-1.jsonl line 2: not JSON" in caplog.text


def test_verl_rollouts_are_scrubbed_and_survive_text_that_is_not_unicode(tmp_path):
    # as the embedded backend's write_rollouts (tests/envs/test_tool_limits.py): a reward error quoting a
    # key, and a lone surrogate from a Python tool's undecodable bytes, must neither leak nor fail the step
    from rl_factory.base.secrets import protect

    secret = "sk-live-" + "run-dir-4d9e1b"
    protect([secret])
    bad = {**_record(0.0), "reward_info": {"reward_error": f"HTTP 401 for key {secret}"}, "final_text": "caf\udce9"}
    write_part(tmp_path, "train", 1, [bad, _record(1.0, 1)])
    logger = _logger(tmp_path, resume=False)
    logger.log({"timing_s/step": 1.0}, step=1)
    text = (tmp_path / "rollouts" / "step_000001.jsonl").read_text(encoding="utf-8")
    assert secret not in text and "HTTP 401 for key ***" in text
    kept = [json.loads(x) for x in text.splitlines()]
    # written as the JSON escape \udce9, so it reads back as the same string: nothing lost
    assert [r["session"] for r in kept] == [0, 1] and kept[0]["final_text"] == "caf\udce9"


# ---- a run directory belongs to one run: the embedded trainer's check, on verl ----

def _verl_config(run, *overrides):
    from rl_factory.config import load_config

    # a model path that does not exist: every test here stops before a model is read (tuning only warns)
    return load_config("grpo", ["trainer.backend=verl", f"trainer.output_dir={run}", "model.path=/nonexistent/model",
                                *overrides])


def _a_finished_run(run, ours):
    """What a verl run leaves that says whose directory it is: run.json and a logged step."""
    from rl_factory.config import redacted
    from rl_factory.fingerprint import run_view
    from rl_factory.run import RUN_FILE

    run.mkdir(parents=True)
    (run / RUN_FILE).write_text(json.dumps({"run_id": "0123abcd4567", "view": run_view(redacted(ours))}))
    (run / "metrics.jsonl").write_text('{"step": 1, "reward/mean": 0.5}\n')
    return sorted(p.name for p in run.iterdir())


def test_verl_refuses_a_directory_of_another_config_with_the_embedded_message(tmp_path):
    pytest.importorskip("verl")
    from rl_factory.backends.verl.launcher import train
    from rl_factory.config import ConfigError
    from rl_factory.run import RunDir

    run = tmp_path / "run"
    before = _a_finished_run(run, _verl_config(run))
    other = _verl_config(run, "optim.lr=1e-5")
    with pytest.raises(ConfigError) as verl_refusal:
        train(other, [])
    with pytest.raises(ConfigError) as embedded_refusal:
        RunDir(run).resume_point(other, "auto", 40)  # the embedded trainer's first call
    assert str(verl_refusal.value) == str(embedded_refusal.value)
    assert re.search(r"run holds run 0123abcd4567 with another config \(optim.lr [\d.e-]+ -> 1e-05\); to keep it",
                     str(verl_refusal.value))
    assert sorted(p.name for p in run.iterdir()) == before  # no verl_data/, no config.yaml
    with pytest.raises(ConfigError, match=r"-> 1e-05, verl_overrides \(unset\) -> \[\"actor_rollout_ref"):  # raw keys too
        train(other, ["actor_rollout_ref.actor.use_dynamic_bsz=false"])


@pytest.mark.parametrize("resume, where", [("auto", "run"), ("never", "run-2"), ("force", "run")])
def test_verl_continues_its_own_directory_and_never_moves_to_a_fresh_one(tmp_path, resume, where):
    pytest.importorskip("verl")
    import torch

    from rl_factory.backends.verl.launcher import train
    from rl_factory.config import ConfigError

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the run would start")
    run = tmp_path / "run"
    changed = () if resume == "auto" else ("optim.lr=1e-5",)  # never / force: even with another config
    before = _a_finished_run(run, _verl_config(run))
    with pytest.raises(ConfigError, match="CUDA device"):  # past the claim and verl's validation: the GPU check
        train(_verl_config(run, f"trainer.resume={resume}", *changed), [])
    assert (tmp_path / where / "verl_data" / "train.parquet").is_file()
    if where != "run":
        assert sorted(p.name for p in run.iterdir()) == before  # the other run's directory is untouched


def test_nothing_is_written_before_verl_validates_the_config(tmp_path):
    pytest.importorskip("verl")
    from rl_factory.backends.verl.launcher import train
    from rl_factory.config import ConfigError

    run = tmp_path / "run"
    with pytest.raises(ConfigError, match=r"^verl rejects data\.train_batch_size x actor_rollout_ref\.rollout\.n .*: "
                                         r"real_train_batch_size \(9\) must be divisible"):
        train(_verl_config(run, "data.train_batch_size=3", "rollout.n=3"), ["actor_rollout_ref.actor.use_dynamic_bsz=false"])
    assert not run.exists()  # neither verl_data/ nor config.yaml


def test_the_verl_launchers_run_json_is_what_the_next_claim_reads(tmp_path):
    from rl_factory.backends.verl.launcher import claim_run_dir
    from rl_factory.config import ConfigError
    from rl_factory.run import RUN_FILE

    run = tmp_path / "run"
    first = claim_run_dir(_verl_config(run), ["trainer.n_gpus_per_node=2"])
    first.record()
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    again = claim_run_dir(_verl_config(run), ["trainer.n_gpus_per_node=2"])
    assert again.run_id == first.run_id == json.loads((run / RUN_FILE).read_text())["run_id"]
    with pytest.raises(ConfigError, match=r"verl_overrides \[\"trainer.n_gpus_per_node=2\"\] -> \(unset\)"):
        claim_run_dir(_verl_config(run), [])


def test_the_steps_arena_metrics_are_the_groups_lines_summed_as_the_embedded_run_logs_them(tmp_path):
    """On verl each worker process appends one arena/* line per group it played (group.py); the step's metrics
    line carries their sums (the Spearman correlation: the mean over the groups that have one), as an embedded
    arena run's line does. Another step's lines and a torn line count for nothing."""
    run = tmp_path
    logger = _logger(run, resume=False)
    for worker, lines in {"host-1": [{"step": 1, "uid": "a", "arena/judge_calls": 12.0, "arena/ties": 2.0,
                                      "arena/judge_requests": 20.0, "arena/reward_spearman": 0.5},
                                     {"step": 2, "uid": "c", "arena/judge_calls": 99.0}],
                          "host-2": [{"step": 1, "uid": "b", "arena/judge_calls": 12.0, "arena/ties": 0.0,
                                      "arena/judge_requests": 24.0, "arena/reward_spearman": 0.25}]}.items():
        (run / "arena" / worker).mkdir(parents=True)
        text = "".join(json.dumps(x) + "\n" for x in lines)
        (run / "arena" / worker / "metrics.jsonl").write_text(text + ('{"step": 1, "arena/judge_calls": 5' if
                                                                      worker == "host-2" else ""))
    _step(logger, run, 1, 1.0)
    line = json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])
    assert line["arena/judge_calls"] == 24.0 and line["arena/ties"] == 2.0 and line["arena/judge_requests"] == 44.0
    assert line["arena/reward_spearman"] == pytest.approx(0.375)
    # step 2's line, read (and kept) while step 1 was logged, is step 2's: each line counts once
    _step(logger, run, 2, 1.0)
    line = json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])
    assert line["arena/judge_calls"] == 99.0 and "arena/ties" not in line


def test_a_late_session_joins_its_steps_file_and_a_reissued_one_replaces_the_line_it_had(tmp_path):
    """An async trainer's session still running when its step was logged writes its line afterwards: the next
    step's gather puts it into its own step's file; a prompt re-issued after a resume rolls the same session out
    again, whose new line replaces the old one. Nothing is lost or doubled."""
    from rl_factory.backends.verl.run_dir import gather, gather_late

    def line(session, reward):
        return {"sample_index": 3, "session": session, "reward": reward, "turns": []}

    write_part(tmp_path, "train", 1, [line(0, 1.0)])
    assert [r["session"] for r in gather(tmp_path, "train", 1)] == [0]
    write_part(tmp_path, "train", 1, [line(1, 0.0)])  # finished after step 1 was logged
    write_part(tmp_path, "train", 2, [line(0, 0.5)])
    assert [(r["step"], r["session"]) for r in gather(tmp_path, "train", 2) + gather_late(tmp_path, 2)] == [(2, 0), (1, 1)]
    write_part(tmp_path, "train", 1, [line(1, 0.25)])  # session 1 again (its prompt re-issued)
    assert gather_late(tmp_path, 3) == [{**line(1, 0.25), "step": 1}]
    assert gather_late(tmp_path, 1) == [] and gather_late(tmp_path, 3) == []
    step_1 = jsonl(tmp_path / "rollouts" / "step_000001.jsonl")
    assert [(r["session"], r["reward"]) for r in step_1] == [(0, 1.0), (1, 0.25)]
    assert not list((tmp_path / "rollouts" / ".parts").glob("*"))


def test_the_first_requests_spread_is_taken_over_the_trajectories_that_sent_one():
    from rl_factory.backends.verl.run_dir import trajectory_timing

    lines = [{"timing": {"wall_s": 2.0, "started_unix": 100.0, "first_request_unix": 100.004, "worker": 7}},
             {"timing": {"wall_s": 1.5, "started_unix": 100.03, "first_request_unix": 100.09, "worker": 8}},
             {"timing": {"wall_s": 0.01, "started_unix": 100.05, "worker": 8}}]  # a failed episode: no request
    out = trajectory_timing(lines)
    assert out["timing/trajectory_starts_s"] == pytest.approx(0.05)
    assert out["timing/trajectory_starts_in_worker_s"] == pytest.approx(0.02)  # worker 8: 100.03 to 100.05
    assert out["timing/request_starts_s"] == pytest.approx(0.086)  # 100.004 to 100.09
    assert out["timing/before_first_request_s"] == pytest.approx(0.06)  # the second: 100.03 to 100.09
    assert "timing/request_starts_s" not in trajectory_timing([{"timing": {"wall_s": 1.0, "started_unix": 1.0}}])
