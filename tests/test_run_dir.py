"""A run directory belongs to one run: fingerprints, refusals, trainer.resume modes, nothing written early."""
import json

import pytest
import yaml
from omegaconf import OmegaConf

from rl_factory.config import ConfigError, load_config
from rl_factory.fingerprint import describe_diff, run_view
from rl_factory.run import RUN_FILE, RunDir


def cfg_for(run_dir, *overrides):
    return load_config("grpo", [f"trainer.output_dir={run_dir}", *overrides])


def finished_run(run_dir, *overrides, step=40):
    """A run directory as a finished run leaves it: run.json, config.yaml, metrics, one checkpoint."""
    run = RunDir(run_dir)
    assert run.resume_point(cfg_for(run_dir, *overrides), "auto", 40) is None
    run.start(cfg_for(run_dir, *overrides), resumed=False)
    (run_dir / "metrics.jsonl").write_text(json.dumps({"step": step, "reward/mean": 1.0}) + "\n")
    ckpt = run_dir / "checkpoints" / f"step_{step:06d}"
    ckpt.mkdir(parents=True)
    (ckpt / "trainer_state.pt").write_bytes(b"x")
    return run


def snapshot(run_dir):
    return {p.relative_to(run_dir): p.read_bytes() for p in sorted(run_dir.rglob("*")) if p.is_file()}


def test_same_config_resumes_and_keeps_its_run_id(tmp_path):
    first = finished_run(tmp_path / "run", step=20)
    run = RunDir(tmp_path / "run")
    # trainer.* bookkeeping and total_steps may change on resume: still the same run
    point = run.resume_point(cfg_for(tmp_path / "run", "trainer.total_steps=60", "trainer.save_every=5",
                                     "model.device=cpu"), "auto", 60)
    assert point == tmp_path / "run" / "checkpoints" / "step_000020"
    assert run.run_id == first.run_id and run.finished_step is None


def test_other_config_is_refused_in_one_line_and_nothing_is_written(tmp_path):
    run_dir = tmp_path / "run"
    first = finished_run(run_dir)
    before = snapshot(run_dir)
    with pytest.raises(ConfigError) as err:
        RunDir(run_dir).resume_point(cfg_for(run_dir, "rollout.n=4", "optim.lr=1e-5"), "auto", 40)
    message = str(err.value)
    # One short line, measured as a user sees it for the default run directory: the path of this
    # test's (twice in it) depends on the machine (pytest's numbered basetemp, an xdist worker's dir).
    assert "\n" not in message and len(message.replace(str(run_dir), "outputs/calculator_grpo")) < 400
    assert first.run_id in message and "step 40" in message
    assert "rollout.n 8 -> 4" in message and "optim.lr 0.0003 -> 1e-05" in message
    for choice in ("experiment_name=", "trainer.resume=never", f"{run_dir}-2", "trainer.resume=force"):
        assert choice in message
    assert snapshot(run_dir) == before


def test_changed_manifest_contents_are_another_run(tmp_path):
    manifest = tmp_path / "tools.yaml"
    manifest.write_text((OmegaConf.to_yaml(OmegaConf.load("configs/tools/calculator.yaml"))))
    run_dir = tmp_path / "run"
    finished_run(run_dir, f"env.tools={manifest}")
    manifest.write_text(manifest.read_text().replace("timeout_s: 10", "timeout_s: 11"))
    with pytest.raises(ConfigError, match=r"env.tools \(the manifest file's contents changed\)"):
        RunDir(run_dir).resume_point(cfg_for(run_dir, f"env.tools={manifest}"), "auto", 40)


def test_resume_never_starts_in_a_fresh_sibling(tmp_path):
    run_dir = tmp_path / "run"
    finished_run(run_dir)
    before = snapshot(run_dir)
    run = RunDir(run_dir)
    assert run.resume_point(cfg_for(run_dir, "rollout.n=4"), "never", 40) is None
    assert run.path == tmp_path / "run-2"
    run.start(cfg_for(run_dir, "rollout.n=4"), resumed=False)
    assert yaml.safe_load((tmp_path / "run-2" / "config.yaml").read_text())["rollout"]["n"] == 4
    assert snapshot(run_dir) == before


def test_resume_force_continues_with_the_new_config(tmp_path):
    run_dir = tmp_path / "run"
    first = finished_run(run_dir, step=20)
    run = RunDir(run_dir)
    cfg = cfg_for(run_dir, "optim.lr=1e-5")
    assert run.resume_point(cfg, "force", 40) == run_dir / "checkpoints" / "step_000020"
    run.start(cfg, resumed=True)
    record = json.loads((run_dir / RUN_FILE).read_text())
    assert record["run_id"] == first.run_id and record["view"]["optim.lr"] == 1e-5
    assert "continuing with a changed config (optim.lr 0.0003 -> 1e-05)" in (run_dir / "train.log").read_text()


def test_total_steps_at_or_below_the_finished_step_says_so(tmp_path):
    run_dir = tmp_path / "run"
    finished_run(run_dir, step=40)
    for total in (40, 10):
        run = RunDir(run_dir)
        run.resume_point(cfg_for(run_dir, f"trainer.total_steps={total}"), "auto", total)
        assert run.finished_step == 40
        assert run.nothing_to_do(total)["nothing_to_do"] is True


def test_a_directory_without_results_is_taken_over(tmp_path):
    run_dir = tmp_path / "run"
    run = RunDir(run_dir)
    run.resume_point(cfg_for(run_dir), "auto", 40)
    run.start(cfg_for(run_dir), resumed=False)  # e.g. a run whose server then failed to start
    again = RunDir(run_dir)
    assert again.resume_point(cfg_for(run_dir, "rollout.n=4"), "auto", 40) is None


def test_a_legacy_directory_is_judged_by_its_config_yaml(tmp_path):
    run_dir = tmp_path / "run"
    finished_run(run_dir)
    (run_dir / RUN_FILE).unlink()
    with pytest.raises(ConfigError, match="holds a run, checkpoint at step 40 with another config"):
        RunDir(run_dir).resume_point(cfg_for(run_dir, "rollout.n=4"), "auto", 40)


def test_bad_resume_value_names_the_choices(tmp_path):
    with pytest.raises(ConfigError, match="trainer.resume: nope is neither one of auto, never, force"):
        RunDir(tmp_path / "run").resume_point(cfg_for(tmp_path / "run"), "nope", 40)
    assert not (tmp_path / "run").exists()


def test_describe_diff_lists_the_first_differences():
    old = run_view({"a": {"b": 1, "c": "x"}, "d": [1, 2], "e": 1, "f": 1})
    new = run_view({"a": {"b": 2, "c": "x"}, "d": [1], "e": 2, "f": 2})
    assert describe_diff(old, new, limit=2) == "a.b 1 -> 2, d [1, 2] -> [1] [+2 more]"
    assert describe_diff(old, old) == ""
