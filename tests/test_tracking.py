import json
import sys
import types

import pytest
import torch

from rl_factory.tracking import Tracker, TrackingError


def steps_in(path):
    return [json.loads(line)["step"] for line in path.read_text().splitlines()]


def test_jsonl_resume_truncates_later_steps(tmp_path):
    with Tracker(tmp_path, ["jsonl"]) as tracker:
        for step in range(5):
            tracker.log({"reward/mean": step / 10}, step)
    with (tmp_path / "metrics.jsonl").open("a") as f:
        f.write('{"step": 5, "reward/me')  # torn line from a killed run
    with Tracker(tmp_path, ["jsonl"], resume_step=3) as tracker:
        assert steps_in(tmp_path / "metrics.jsonl") == [0, 1, 2]
        tracker.log({"reward/mean": 0.3}, 3)
        tracker.log({"reward/mean": 0.4}, 4)
    assert steps_in(tmp_path / "metrics.jsonl") == [0, 1, 2, 3, 4]


def test_jsonl_values_are_plain_json(tmp_path):
    with Tracker(tmp_path, ["jsonl"]) as tracker:
        tracker.log({"loss": torch.tensor(0.5), "timing": {"rollout_s": 1.5}, "bad": float("nan")},
                    step=1)
    assert json.loads((tmp_path / "metrics.jsonl").read_text()) == {
        "step": 1, "loss": 0.5, "timing/rollout_s": 1.5, "bad": None}


def test_console_prints_every_n_steps(tmp_path, capsys):
    tracker = Tracker(tmp_path, ["console"], options={"console": {"every": 2, "keys": ["loss"]}})
    for step in range(1, 5):
        tracker.log({"loss": 0.25, "other": 1}, step)
    tracker.close()
    assert capsys.readouterr().out.splitlines() == ["step 2 | loss 0.25", "step 4 | loss 0.25"]


def test_tensorboard_writes_event_file(tmp_path):
    with Tracker(tmp_path, ["tensorboard"], config={"lr": 1e-6}) as tracker:
        tracker.log({"reward/mean": 0.5, "note": "text is skipped"}, 0)
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))


def test_unknown_logger_and_stray_options(tmp_path):
    with pytest.raises(TrackingError, match=r"unknown logger\(s\) \['mlflow'\]; valid: .*'jsonl'"):
        Tracker(tmp_path, ["jsonl", "mlflow"])
    with pytest.raises(TrackingError, match="options given for logger"):
        Tracker(tmp_path, ["jsonl"], options={"wandb": {}})


def test_wandb_missing_gives_clear_error(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # makes `import wandb` raise ImportError
    with pytest.raises(TrackingError, match=r"needs the wandb package: `.*pip install .*\[wandb\]'`, or remove it"):
        Tracker(tmp_path, ["wandb"])


def test_wandb_offline_and_resumes_same_run(tmp_path, monkeypatch):
    calls = []
    run = types.SimpleNamespace(log=lambda m, step: calls.append(("log", step)),
                                finish=lambda: calls.append(("finish",)))
    fake = types.SimpleNamespace(util=types.SimpleNamespace(generate_id=lambda: "abc123"),
                                 init=lambda **kw: calls.append(("init", kw)) or run)
    monkeypatch.setitem(sys.modules, "wandb", fake)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    with Tracker(tmp_path, ["wandb"]) as tracker:
        tracker.log({"loss": 1.0}, 0)
    fake.util.generate_id = lambda: "other"
    Tracker(tmp_path, ["wandb"], resume_step=1).close()
    inits = [c[1] for c in calls if c[0] == "init"]
    assert [kw["mode"] for kw in inits] == ["offline", "offline"]
    assert [kw["id"] for kw in inits] == ["abc123", "abc123"]
    assert ("log", 0) in calls and calls.count(("finish",)) == 2
