"""GAE end to end: `bash main_grpo.sh algorithm.advantage=gae ...` with process rewards, then
`main_eval.sh` on its checkpoint, then a resumed run that restores the value head."""
import torch

from tests.e2e.test_main_scripts import (marked_calculator_manifest, metrics_lines, no_server_left, run_script,
                                         strict_json, tiny_overrides)
import pytest

pytestmark = pytest.mark.slow  # the launch scripts and training runs, end to end


def test_gae_run_evaluates_and_resumes_with_its_value_head(tiny_model_dir, tmp_path):
    manifest, marker = marked_calculator_manifest(tmp_path)
    run = tmp_path / "run"
    # A constant per-turn reward: the returns are never all 0, so the critic always has something to learn.
    per_turn = tmp_path / "per_turn.py"
    per_turn.write_text("def per_turn(text, tool_results):\n    return 0.1\n")
    gae = ["algorithm.advantage=gae", "+algorithm.advantage_options.lam=0.95", "algorithm.critic.lr=0.01",
           "reward.process.tool_error_penalty=-0.1", f"reward.process.function={per_turn}:per_turn"]
    result = run_script("main_grpo.sh", *tiny_overrides(tiny_model_dir, run, manifest), *gae)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    lines = metrics_lines(run)
    assert [m["step"] for m in lines] == [0, 1, 2]
    for m in lines[1:]:
        assert {"critic/value_loss", "critic/values_mean", "critic/vf_explained_var", "reward/process/mean",
                "actor/loss"} <= set(m)
    assert lines[1]["critic/values_mean"] == 0.0  # the head starts at zero
    ckpt = run / "checkpoints" / "step_000002"
    head = torch.load(ckpt / "value_head.pt")
    assert head["linear.weight"].abs().sum() > 0  # it trained

    out = tmp_path / "eval"
    result = run_script("main_eval.sh", f"model.path={ckpt}", "eval.limit=4", f"eval.output_dir={out}",
                        f"env.tools={manifest}", "rollout.max_response_tokens=32", "model.device=cpu")
    assert result.returncode == 0, result.stderr[-3000:]
    assert strict_json((out / "results.json").read_text())["rows"] == 4

    # One more step, resumed from step 2: a restored head gives non-zero values at once.
    result = run_script("main_grpo.sh", *tiny_overrides(tiny_model_dir, run, manifest), *gae, "trainer.total_steps=3")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "restored the value head" in (run / "train.log").read_text()
    lines = metrics_lines(run)
    assert [m["step"] for m in lines] == [0, 1, 2, 3]
    assert lines[3]["critic/values_mean"] != 0.0
    assert (run / "checkpoints" / "step_000003" / "value_head.pt").exists()
    assert no_server_left(marker)
