"""Each run-guard check fires on a fault injected into a real embedded run, and names it.

The runs are the embedded trainer on the session's tiny model with real MCP calculator tools; the faults
go in through the seams a user or a bug would use: an engine built on a copy of the model, a tokenizer
that marks the tool-call tags special (decoding drops them), a context policy that re-encodes decoded
text, reward files, a gradient hook. Each test checks the violation's line, its bundle, and that
`python -m rl_factory.guard replay <bundle>` reproduces it (exit code 3).
"""
from __future__ import annotations

import copy
import json
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from rl_factory.config import load_config
from rl_factory.guard import GuardStop
from rl_factory.guard.__main__ import main as guard_main
from tests.records import jsonl

# every test here trains a real (tiny) run with a fault injected: the slow tier (tests/tiers.py)
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
# A reward that varies with the completion: groups get advantages, so step 1 moves the weights.
PARITY_REWARD = "def reward(completion, **_):\n    return float(len(completion) % 2)\n"


def overrides(model_dir: Path, run: Path, *extra: str) -> list[str]:
    return [f"model.path={model_dir}", "model.device=cpu", "trainer.total_steps=3", "data.train_batch_size=2",
            "rollout.n=4", "data.val_limit=2", "env.max_turns=2", "rollout.max_response_tokens=32",
            f"trainer.output_dir={run}", "trainer.eval_every=0", "trainer.save_every=0", "trainer.report=false",
            "trainer.progress=false", *extra]


def train_until_stopped(args: list[str]) -> str:
    from rl_factory.trainer import train

    with pytest.raises(GuardStop) as stopped:
        train(load_config("grpo", args))
    return str(stopped.value)


def bundle_of(run: Path, check: str) -> Path:
    found = sorted((run / "guard").glob(f"step_*_{check}"))
    assert found, f"no {check} bundle in {run / 'guard'}: {sorted((run / 'guard').glob('*'))}"
    bundle = found[0]
    for name in ("finding.json", "check.json", "step.json", "trajectories.jsonl", "metrics_window.jsonl",
                 "config.yaml", "versions.json"):
        assert (bundle / name).is_file(), name
    assert json.loads((bundle / "finding.json").read_text())["check"] == check
    assert guard_main(["replay", str(bundle)]) == 3  # the bundle alone reproduces the violation
    return bundle


def reward_file(tmp_path: Path, text: str, name: str = "reward.py") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_an_engine_that_keeps_its_initial_weights_is_caught_by_its_receipts(tiny_model_dir, tmp_path, monkeypatch):
    import rl_factory.trainer as trainer
    from rl_factory.components import build_agent
    from rl_factory.engines.hf import HFEngine

    def agent_on_a_copy(policy, env, env_cfg, roll_cfg, engine=None):
        frozen = copy.deepcopy(policy.model)  # the fault: generation never sees the updates
        engine = HFEngine(frozen, eos_token_id=policy.tokenizer.eos_token_id,
                          pad_token_id=policy.tokenizer.pad_token_id, max_batch_size=roll_cfg.max_batch_size)
        return build_agent(policy, env, env_cfg, roll_cfg, engine=engine)

    monkeypatch.setattr(trainer, "build_agent", agent_on_a_copy)
    run = tmp_path / "run"
    reward = reward_file(tmp_path, PARITY_REWARD)
    message = train_until_stopped(overrides(tiny_model_dir, run, f"reward.function={reward}:reward"))
    assert "receipts at step 2" in message and "not generate with the weights being trained" in message
    bundle = bundle_of(run, "receipts")
    versions = json.loads((bundle / "versions.json").read_text())
    assert versions["packages"]["torch"] and set(versions["weight_fingerprints"]) == {"1"}
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert lines[-1]["step"] == 2 and lines[-1]["guard/receipts/weights_mismatch"] == 8.0


def test_a_template_whose_tool_call_tags_decoding_drops_stops_tool_calls(tiny_model_dir, tmp_path):
    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    tok = json.loads((model / "tokenizer.json").read_text())
    for added in tok["added_tokens"]:  # the fault: the tags become special, so decoding skips them
        if added["content"] in ("<tool_call>", "</tool_call>"):
            added["special"] = True
    (model / "tokenizer.json").write_text(json.dumps(tok))
    config = model / "tokenizer_config.json"
    data = json.loads(config.read_text())
    for added in (data.get("added_tokens_decoder") or {}).values():
        if added["content"] in ("<tool_call>", "</tool_call>"):
            added["special"] = True
    config.write_text(json.dumps(data))
    run = tmp_path / "run"
    message = train_until_stopped(overrides(model, run, "trainer.guard.tools.action=stop"))
    assert "tools at step 1" in message and "no tool call" in message and "round trip" in message
    bundle_of(run, "tools")


def test_a_reward_that_returns_a_constant(tiny_model_dir, tmp_path):
    run = tmp_path / "run"
    reward = reward_file(tmp_path, "def reward(completion, **_):\n    return 1.0\n")
    args = overrides(tiny_model_dir, run, f"reward.function={reward}:reward", "trainer.guard.reward_constant.steps=2")
    # through main_grpo.sh: the stop is exit code 3 with the check's line
    done = subprocess.run(["bash", str(ROOT / "main_grpo.sh"), *args], capture_output=True, text=True, timeout=600)
    assert done.returncode == 3, done.stderr[-2000:]
    assert "stopped by the run guard: guard: reward_constant at step 2" in done.stderr
    bundle = bundle_of(run, "reward_constant")
    assert len(jsonl(bundle / "trajectories.jsonl")) == 8


def test_a_reward_that_never_reads_the_completion(tiny_model_dir, tmp_path):
    run = tmp_path / "run"
    # a reward of the answer alone: it differs between samples, never between completions
    reward = reward_file(tmp_path, "def reward(completion, answer, **_):\n    return float(len(str(answer)) % 3)\n")
    message = train_until_stopped(overrides(
        tiny_model_dir, run, f"reward.function={reward}:reward", "trainer.guard.reward_probe.every=1",
        "trainer.guard.reward_probe.probes=2", "data.train_batch_size=4", "trainer.guard.reward_constant.action=off"))
    assert "reward_probe" in message and "does not read the completion" in message
    bundle_of(run, "reward_probe")


def test_a_reward_file_rewritten_mid_run(tiny_model_dir, tmp_path):
    run = tmp_path / "run"
    calls = tmp_path / "calls"
    # the fault: the reward's own source changes after its first 8 calls (step 1 scores 8 trajectories
    # after validation's 2)
    reward = reward_file(tmp_path, (
        "from pathlib import Path\n"
        f"CALLS = Path({str(calls)!r})\n"
        "def reward(completion, **_):\n"
        "    n = int(CALLS.read_text()) + 1 if CALLS.exists() else 1\n"
        "    CALLS.write_text(str(n))\n"
        "    if n == 11:\n"
        "        Path(__file__).write_text(Path(__file__).read_text() + '# edited\\n')\n"
        "    return float(len(completion) % 2)\n"))
    message = train_until_stopped(overrides(tiny_model_dir, run, f"reward.function={reward}:reward"))
    assert "reward_files at step 2" in message and str(reward) in message
    bundle_of(run, "reward_files")


def test_a_nan_gradient(tiny_model_dir, tmp_path, monkeypatch):
    import rl_factory.trainer as trainer

    real_load = trainer.load_policy

    def load_with_nan_gradients(*args, **kwargs):
        policy = real_load(*args, **kwargs)
        weight = next(policy.model.parameters())
        weight.register_hook(lambda grad: torch.full_like(grad, float("nan")))  # the fault
        return policy

    monkeypatch.setattr(trainer, "load_policy", load_with_nan_gradients)
    run = tmp_path / "run"
    reward = reward_file(tmp_path, PARITY_REWARD)
    message = train_until_stopped(overrides(tiny_model_dir, run, f"reward.function={reward}:reward",
                                            "trainer.guard.numerics.action=stop"))
    assert "numerics at step 1" in message and "skipped for a non-finite loss or gradient norm" in message
    bundle_of(run, "numerics")


def test_trained_ids_re_encoded_from_text_are_not_the_sampled_ids(tiny_model_dir, tmp_path):
    from rl_factory.context import CONTEXT_POLICIES, AppendContext

    class ReencodingContext(AppendContext):
        """The fault: the generated turn is decoded and encoded again (the eos token is lost on the way)."""

        def add_generation(self, gen) -> None:
            ids = self.fmt.encode(self.fmt.tokenizer.decode(gen.token_ids, skip_special_tokens=True))
            self.ids += ids
            self.mask += [1] * len(ids)
            self.logprobs += (gen.logprobs + [0.0] * len(ids))[:len(ids)]

    CONTEXT_POLICIES["reencode"] = ReencodingContext
    try:
        run = tmp_path / "run"
        message = train_until_stopped(overrides(tiny_model_dir, run, "rollout.context=reencode"))
    finally:
        del CONTEXT_POLICIES["reencode"]
    assert "tokens at step 1" in message and "train ids never sampled" in message
    bundle_of(run, "tokens")


def test_an_engine_that_generates_with_the_lora_adapter_disabled_is_caught_by_its_receipts(tiny_model_dir, tmp_path,
                                                                                          monkeypatch):
    from rl_factory.engines import hf_batch

    real_forward = hf_batch._Batch._forward

    def forward_without_the_adapter(self, *args, **kwargs):
        with self.model.disable_adapter():  # the fault: the engine samples from the base model
            return real_forward(self, *args, **kwargs)

    monkeypatch.setattr(hf_batch._Batch, "_forward", forward_without_the_adapter)
    run = tmp_path / "run"
    message = train_until_stopped(overrides(tiny_model_dir, run, "model.lora_rank=4", "model.lora_alpha=8"))
    # at step 1 the adapter's B is still zero (disabled computes the same logits): the state tells them apart
    assert "receipts at step 1" in message and "LoRA adapter disabled" in message
    assert "0 of 28 adapter layers enabled" in message and "28 of 28 adapter layers enabled" in message
    bundle_of(run, "receipts")
