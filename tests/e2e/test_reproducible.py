"""Same seed and config, same run: `bash main_grpo.sh` twice gives identical metrics and weights on CPU.

Both runs use the continuously batched engine and real tool calls, whose latencies reorder the
generation requests differently every time; only the wall-clock keys of metrics.jsonl
(`rl_factory.tracking.WALL_CLOCK_PREFIXES`) may differ. The reward (the parity of the completion's
length) varies within every group, so every step trains and the weights move.
"""
import json

import pytest
import torch
from safetensors.torch import load_file

from rl_factory.tracking import WALL_CLOCK_PREFIXES, reproducible_metrics
from tests.e2e.test_main_scripts import marked_calculator_manifest, run_script, tiny_overrides

pytestmark = pytest.mark.slow  # the launch scripts and training runs, end to end


PARITY_REWARD = "def reward(completion, **_):\n    return float(len(completion) % 2)\n"


def run(model_dir, tmp_path, name: str) -> tuple[list[dict], dict[str, torch.Tensor]]:
    manifest, _ = marked_calculator_manifest(tmp_path)
    reward = tmp_path / "parity_reward.py"
    reward.write_text(PARITY_REWARD)
    out = tmp_path / name
    overrides = tiny_overrides(model_dir, out, manifest) + [
        "trainer.total_steps=3", "data.train_batch_size=4", "rollout.n=4", "trainer.save_every=0",
        "trainer.eval_every=2", f"reward.function={reward}:reward", "optim.lr=1e-3"]
    result = run_script("main_grpo.sh", *overrides)
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return metrics, load_file(str(out / "checkpoints" / "step_000003" / "model.safetensors"))


@pytest.fixture(scope="module")
def runs(tiny_model_dir, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("repro")
    return {name: run(tiny_model_dir, tmp, name) for name in ("a", "b")}


def test_same_seed_gives_identical_metrics_and_weights(runs, tiny_model_dir):
    (metrics_a, weights_a), (metrics_b, weights_b) = runs["a"], runs["b"]
    assert [m["step"] for m in metrics_a] == [0, 1, 2, 3]
    for a, b in zip(metrics_a, metrics_b, strict=True):
        assert reproducible_metrics(a) == reproducible_metrics(b)  # exact floats, every key
        assert set(a) == set(b)
    assert any(k.startswith(WALL_CLOCK_PREFIXES) for k in metrics_a[1])  # the excluded keys exist...
    for m in metrics_a[1:]:  # every step trained: the comparison covers losses, gradients, weights
        assert {"reward/mean", "actor/loss", "actor/grad_norm"} <= set(m) and m["actor/trained_fraction"] > 0
    assert "val/accuracy" in metrics_a[2]
    assert weights_a.keys() == weights_b.keys()
    for name in weights_a:
        assert torch.equal(weights_a[name], weights_b[name]), name
    initial = load_file(str(tiny_model_dir / "model.safetensors"))
    assert any(not torch.equal(weights_a[k], initial[k]) for k in weights_a)
