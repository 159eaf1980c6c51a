"""`bash main_eval.sh` with no model: the last checkpoint of the run the same config trains, or one line saying how."""
from rl_factory.cli import main
from rl_factory.config import load_config
from rl_factory.evaluate_cli import model_path


def test_no_checkpoint_is_one_line_that_says_how_to_get_one(tmp_path, capsys):
    run_dir = tmp_path / "run"
    assert main(["eval", f"trainer.output_dir={run_dir}", f"eval.output_dir={tmp_path / 'eval'}"]) == 2
    assert capsys.readouterr().err == (
        f"error: no model.path given and {run_dir} has no checkpoint to evaluate: train one with `bash main_grpo.sh` "
        "(with the same overrides), or pass model.path=<checkpoint dir, hub id, or builtin:tiny-calculator for the "
        "untrained default>\n")
    assert not (tmp_path / "eval").exists()


def test_a_given_model_is_evaluated_as_given(tmp_path):
    (tmp_path / "run" / "checkpoints" / "step_000003").mkdir(parents=True)  # a checkpoint does not win over it
    cfg = load_config("eval", ["model.path=builtin:tiny-calculator", f"trainer.output_dir={tmp_path / 'run'}"])
    assert model_path(cfg) == "builtin:tiny-calculator"


def test_the_default_is_the_experiments_run_directory():
    cfg = load_config("eval", ["experiment_name=my_task"])
    assert cfg.model.path is None and cfg.trainer.output_dir == "outputs/my_task"
