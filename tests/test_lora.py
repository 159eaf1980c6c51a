"""LoRA on the embedded backend: adapters train, the engine samples them, checkpoints load and resume."""
import asyncio
import json

import torch

from rl_factory.engines.base import SamplingParams
from rl_factory.engines.hf import HFEngine
from rl_factory.policy import ModelConfig, load_policy
from tests.e2e.test_main_scripts import marked_manifest, metrics_lines, run_script, tiny_overrides  # noqa: F401
import pytest

pytestmark = pytest.mark.slow  # LoRA training runs that save, evaluate and resume


def _teacher_forced(policy, prompt, generated):
    ids = torch.tensor([prompt + generated])
    with torch.no_grad():
        return policy.sequence_logprobs(ids, torch.ones_like(ids))[0, len(prompt):]


def test_engine_samples_the_updated_adapters(tiny_model_dir, calculator_tools):
    policy = load_policy(ModelConfig(path=str(tiny_model_dir), device="cpu", lora_rank=4, lora_alpha=8),
                         calculator_tools)
    trainable = [p for p in policy.model.parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n, p in policy.model.named_parameters() if p.requires_grad)
    engine = HFEngine(policy.model, policy.tokenizer.eos_token_id, policy.tokenizer.pad_token_id)
    prompt = policy.tokenizer.apply_chat_template([{"role": "user", "content": "What is 12 * 34?"}],
                                                   tokenize=False, add_generation_prompt=True)
    prompt = policy.tokenizer.encode(prompt, add_special_tokens=False)
    params = SamplingParams(temperature=0.0, top_p=1.0, max_new_tokens=12)

    async def generate_update_generate():
        try:
            before = await engine.generate(prompt, params)
            # One optimizer step on the adapters alone: push down the greedy answer's probability.
            opt = torch.optim.AdamW(trainable, lr=0.05)
            target = torch.tensor([prompt + before.token_ids])
            policy.sequence_logprobs(target, torch.ones_like(target))[0, len(prompt):].sum().backward()
            opt.step()
            policy.model.eval()
            return await engine.generate(prompt, params)
        finally:
            await engine.close()

    after = asyncio.run(generate_update_generate())
    # What the engine reports equals a teacher-forced pass of the *updated* model...
    torch.testing.assert_close(torch.tensor(after.logprobs), _teacher_forced(policy, prompt, after.token_ids),
                               rtol=1e-4, atol=1e-4)
    # ...and not of the initial weights (adapters disabled = the base model)
    with policy.model.disable_adapter():
        base = _teacher_forced(policy, prompt, after.token_ids)
    assert (torch.tensor(after.logprobs) - base).abs().max() > 0.05
    assert all(not p.requires_grad for n, p in policy.model.named_parameters() if "lora_" not in n)


def test_lora_run_saves_evaluates_and_resumes(tiny_model_dir, tmp_path, marked_manifest):
    from transformers import AutoModelForCausalLM

    manifest, _ = marked_manifest
    run_dir = tmp_path / "run"
    # A reward that differs within every group (a soft length penalty): each step has an update to make.
    reward = '[{function: "rewards.rules:length_penalty", kwargs: {max_tokens: 1, window: 64}}]'
    args = [*tiny_overrides(tiny_model_dir, run_dir, manifest), "model.lora_rank=4", "optim.lr=0.02",
            f"reward.functions={reward}", "rollout.temperature=1.5"]
    first = run_script("main_grpo.sh", *args)
    assert first.returncode == 0, first.stderr[-3000:]
    ckpt = run_dir / "checkpoints" / "step_000002"
    assert (ckpt / "adapter_model.safetensors").exists() and (ckpt / "adapter_config.json").exists()
    assert not (ckpt / "model.safetensors").exists()  # the adapter only: a few KB, not the model
    # transformers (with peft) loads base + adapter from the checkpoint directory
    tuned = AutoModelForCausalLM.from_pretrained(ckpt)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    with torch.no_grad():
        assert not torch.allclose(tuned(ids).logits, base(ids).logits)
    evaluated = run_script("main_eval.sh", f"model.path={ckpt}", "eval.limit=4", f"eval.output_dir={tmp_path / 'eval'}",
                           f"env.tools={manifest}", "model.device=cpu", f"reward.functions={reward}")
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    results = json.loads((tmp_path / "eval" / "results.json").read_text())
    assert results["model"] == str(ckpt) and "reward/length_penalty/mean" in json.dumps(results)
    assert all(m.get("actor/trained_fraction", 1) > 0 for m in metrics_lines(run_dir)[1:])
    # resume: two more steps on the same run continue from step 2's adapter and optimizer state
    resumed = run_script("main_grpo.sh", *[a for a in args if not a.startswith("trainer.total_steps")],
                         "trainer.total_steps=3")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from" in (run_dir / "train.log").read_text()
    assert [m["step"] for m in metrics_lines(run_dir)] == [0, 1, 2, 3]


def test_an_engine_that_cannot_drive_the_model_fails_requests_instead_of_hanging(tiny_model_dir):
    import pytest

    from rl_factory.engines.hf import HFEngine

    class NoHead(torch.nn.Module):  # not a causal LM: the engine cannot build its batch state
        config = None

    engine = HFEngine(NoHead(), eos_token_id=0, pad_token_id=0)

    async def generate():
        try:
            return await asyncio.wait_for(engine.generate([1, 2, 3], SamplingParams(0.0, 1.0, 4)), timeout=30)
        finally:
            await engine.close()

    with pytest.raises(Exception) as info:
        asyncio.run(generate())
    assert "cannot drive this model" in str(info.value)
