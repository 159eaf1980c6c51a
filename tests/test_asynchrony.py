"""Async training on the embedded backend (rl_factory/asynchrony.py): weights reach the generator with the
version it records, partial and whole-trajectory swaps, the staleness bound in real runs, arena groups."""
import asyncio
import copy
import csv
from collections import Counter
from types import SimpleNamespace

import pytest
import torch

from rl_factory.asynchrony import Ahead, TrajectoryGate
from rl_factory.engines.base import SamplingParams
from rl_factory.engines.hf import HFEngine
from rl_factory.policy import ModelConfig, load_policy
from tests.e2e.test_main_scripts import marked_manifest, metrics_lines, run_script, tiny_overrides  # noqa: F401
from tests.records import jsonl


def _prompt(policy, text="What is 12 * 34?"):
    rendered = policy.tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                                    add_generation_prompt=True)
    return policy.tokenizer.encode(rendered, add_special_tokens=False)


def _teacher_forced(policy, prompt, generated, model=None):
    ids = torch.tensor([prompt + generated])
    with torch.no_grad():
        return policy.sequence_logprobs(ids, torch.ones_like(ids), model=model)[0, len(prompt):]


def _push_adapters(policy, prompt, generated, lr=0.05):
    """One optimizer step on the trainable tensors: push down the probability of `generated`."""
    trainable = [p for p in policy.model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trainable, lr=lr)
    target = torch.tensor([prompt + generated])
    policy.sequence_logprobs(target, torch.ones_like(target))[0, len(prompt):].sum().backward()
    opt.step()
    opt.zero_grad()
    policy.model.eval()


def test_lora_generator_samples_the_adapter_of_the_version_it_records(tiny_model_dir, calculator_tools):
    """The generator has its own copy of the model; after an update only `Ahead.publish` brings the new
    adapters to it. Its tokens are tagged with the published version, and their log-probs are those of that
    version's adapters, not the previous ones: this fails if the weights stop reaching the generator."""
    policy = load_policy(ModelConfig(path=str(tiny_model_dir), device="cpu", lora_rank=4, lora_alpha=8),
                         calculator_tools)
    engine = HFEngine(policy.model, policy.tokenizer.eos_token_id, policy.tokenizer.pad_token_id)
    ahead = Ahead(None, None, SimpleNamespace(engine=engine), policy, max_staleness=1, partial=True, step=0,
                  total_steps=2)
    assert engine.model is not policy.model  # updates of the trainer's model do not reach it by themselves
    prompt = _prompt(policy)
    params = SamplingParams(temperature=0.0, top_p=1.0, max_new_tokens=12)

    async def run():
        try:
            before = await engine.generate(prompt, params)
            _push_adapters(policy, prompt, before.token_ids)
            stale = await engine.generate(prompt, params)  # not published yet: still version 0
            await ahead.publish(1)
            return before, stale, await engine.generate(prompt, params)
        finally:
            await engine.close()

    before, stale, after = asyncio.run(run())
    assert before.version_spans == [(0, len(before.token_ids))]
    assert stale.token_ids == before.token_ids and stale.version_spans == [(0, len(stale.token_ids))]
    assert after.version_spans == [(1, len(after.token_ids))]
    # the log-probs it recorded are version 1's adapters' (a teacher-forced pass of the trainer's model)...
    torch.testing.assert_close(torch.tensor(after.logprobs), _teacher_forced(policy, prompt, after.token_ids),
                               rtol=1e-4, atol=1e-4)
    # ...and not version 0's (the generator's weights before the publish: the base model, LoRA B = 0)
    with policy.model.disable_adapter():
        old = _teacher_forced(policy, prompt, after.token_ids)
    assert (torch.tensor(after.logprobs) - old).abs().max() > 0.05


def test_partial_swap_switches_a_running_row_between_tokens(tiny_model_dir, calculator_tools):
    """A swap that arrives mid-generation: the row goes on, the tokens after the swap are sampled by the new
    weights (their log-probs are the new model's given the same prefix), and the spans say where it switched."""
    policy = load_policy(ModelConfig(path=str(tiny_model_dir), device="cpu"), calculator_tools)
    engine = HFEngine(policy.model, eos_token_id=-1, pad_token_id=policy.tokenizer.pad_token_id)  # never stops
    ahead = Ahead(None, None, SimpleNamespace(engine=engine), policy, max_staleness=1, partial=True, step=0,
                  total_steps=2)
    old_model = ahead.engine.model
    frozen_old = copy.deepcopy(old_model)
    prompt = _prompt(policy)
    params = SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=60, seed=7)

    async def run():
        try:
            task = asyncio.create_task(engine.generate(prompt, params))
            while not (engine._batch and engine._batch.rows and len(engine._batch.rows[0].ids) >= 10):
                await asyncio.sleep(0.001)
            with torch.no_grad():  # a large, visible change of the trainer's weights
                for p in policy.model.parameters():
                    p.add_(torch.randn_like(p) * 0.05)
            await ahead.publish(1)
            return await task
        finally:
            await engine.close()

    gen = asyncio.run(run())
    spans = gen.version_spans
    assert [v for v, _ in spans] == [0, 1] and sum(n for _, n in spans) == 60
    cut = spans[0][1]
    assert 10 < cut < 60
    # before the switch: the old weights' log-probs; after it: not the old weights' any more
    old = _teacher_forced(policy, prompt, gen.token_ids, model=frozen_old)
    torch.testing.assert_close(torch.tensor(gen.logprobs[:cut]), old[:cut], rtol=1e-4, atol=1e-4)
    assert (torch.tensor(gen.logprobs[cut + 1:]) - old[cut + 1:]).abs().max() > 0.01


def test_engine_admits_the_older_steps_turns_first(tiny_model_dir, calculator_tools):
    """Overlapping batches: a request of an older step (lower `priority`) that waits for room goes before a
    newer step's that arrived earlier; the tokens do not depend on the order (each row has its own stream)."""
    policy = load_policy(ModelConfig(path=str(tiny_model_dir), device="cpu"), calculator_tools)
    engine = HFEngine(policy.model, eos_token_id=-1, pad_token_id=policy.tokenizer.pad_token_id, max_batch_size=1)
    prompt = _prompt(policy)
    finished: list[str] = []

    async def generate(name, priority, tokens):
        params = SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=tokens, seed=3, priority=priority)
        out = await engine.generate(prompt, params)
        finished.append(name)
        return out

    async def run():
        try:
            first = asyncio.create_task(generate("running", 0, 40))
            while not (engine._batch and engine._batch.rows):
                await asyncio.sleep(0.001)
            newer = asyncio.create_task(generate("step 3", 3, 5))
            await asyncio.sleep(0.05)  # it arrives first
            older = asyncio.create_task(generate("step 2", 2, 5))
            return await asyncio.gather(first, newer, older)
        finally:
            await engine.close()

    _, newer, older = asyncio.run(run())
    assert finished == ["running", "step 2", "step 3"]
    assert newer.token_ids == older.token_ids  # the same seed and prompt: the order changed nothing else


def test_trajectory_gate_swaps_only_when_no_trajectory_runs():
    async def run():
        gate, events = TrajectoryGate(), []

        async def trajectory(name, hold):
            async with gate.trajectory():
                events.append(f"start {name}")
                await asyncio.sleep(hold)
                events.append(f"end {name}")

        first = asyncio.create_task(trajectory("a", 0.05))
        await asyncio.sleep(0.01)
        await gate.publish(lambda: events.append("swap"))
        second = asyncio.create_task(trajectory("b", 0.0))  # starts after the swap, not beside "a"
        await asyncio.gather(first, second)
        return events

    assert asyncio.run(run()) == ["start a", "end a", "swap", "start b", "end b"]


# ---- real runs -------------------------------------------------------------------------------------------

def _rollouts(run_dir, step):
    return jsonl(run_dir / "rollouts" / f"step_{step:06d}.jsonl")


@pytest.mark.slow  # a real training run
@pytest.mark.parametrize("partial", ["true", "false"])
def test_async_run_keeps_the_staleness_bound_and_records_versions(tiny_model_dir, tmp_path, marked_manifest, partial):
    manifest, _ = marked_manifest
    run_dir = tmp_path / "run"
    result = run_script("main_grpo.sh", *tiny_overrides(tiny_model_dir, run_dir, manifest), "trainer.total_steps=4",
                        "trainer.max_staleness=2", f"trainer.partial_rollouts={partial}", "optim.lr=1e-3")
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = metrics_lines(run_dir)
    assert [m["step"] for m in metrics] == [0, 1, 2, 3, 4]
    for m in metrics[1:]:
        assert 0 <= m["async/staleness/max"] <= 2 and m["timing/trainer_idle_s"] >= 0
        assert m["async/version_spans/mean"] >= 1
    assert metrics[1]["async/staleness/max"] == 0  # step 1's batch is drawn with the initial weights
    # Whether a later batch starts before the update it runs ahead of is timing: with an update faster than a
    # batch's generation (the tiny model on an idle machine) every batch starts on the newest weights. The
    # bound and the spans are what holds whatever the timing; test_partial_swap_* covers a swap mid-trajectory.
    for step in range(1, 5):
        for line in _rollouts(run_dir, step):
            spans = line["policy_versions"]
            assert sum(n for _, n in spans) == line["generated_tokens"]
            assert step - 1 - spans[0][0] <= 2  # trained at most 2 versions after its first token's
            if partial == "false":
                assert len(spans) == 1  # one version per trajectory
    if partial == "false":
        assert all(m["async/version_spans/mean"] == 1 for m in metrics[1:])


def _sample_indices(run_dir, steps):
    return [sorted({line["sample_index"] for line in _rollouts(run_dir, s)}) for s in range(1, steps + 1)]


@pytest.mark.slow  # real training runs
def test_batches_overlap_and_draw_the_prompts_of_the_on_policy_order(tiny_model_dir, tmp_path, marked_manifest):
    """With k=1, step 2's batch starts beside step 1's (version 0 already allows it), and each step still trains
    the prompts the on-policy run draws for it; with dynamic sampling (later rounds draw mid-batch) batches run
    one at a time."""
    manifest, _ = marked_manifest
    runs = {"k0": [], "k1": ["trainer.max_staleness=1"],
            "dynamic": ["trainer.max_staleness=1", "rollout.dynamic_sampling.min_groups=1"]}
    for name, extra in runs.items():
        result = run_script("main_grpo.sh", *tiny_overrides(tiny_model_dir, tmp_path / name, manifest),
                            "trainer.total_steps=3", *extra)
        assert result.returncode == 0, result.stderr[-3000:]
    k1 = metrics_lines(tmp_path / "k1")[1:]
    assert [m["async/batches_in_flight"] for m in k1[:2]] == [1, 2]
    assert _sample_indices(tmp_path / "k1", 3) == _sample_indices(tmp_path / "k0", 3)
    assert all(m["async/batches_in_flight"] == 1 for m in metrics_lines(tmp_path / "dynamic")[1:])


@pytest.mark.slow  # a real training run
def test_on_policy_run_has_no_async_keys(tiny_model_dir, tmp_path, marked_manifest):
    manifest, _ = marked_manifest
    run_dir = tmp_path / "run"
    result = run_script("main_grpo.sh", *tiny_overrides(tiny_model_dir, run_dir, manifest))
    assert result.returncode == 0, result.stderr[-3000:]
    assert not any(k.startswith("async/") or "idle_s" in k for m in metrics_lines(run_dir) for k in m)
    assert all("policy_versions" not in line for line in _rollouts(run_dir, 1))


@pytest.mark.slow  # a real training run
def test_arena_groups_meet_complete_when_rollouts_run_ahead(tiny_model_dir, tmp_path, marked_manifest):
    """ArenaRL needs each group whole: with k=1 every trained group still has its n rollouts in one
    tournament (rankings.csv: n ranks per group per step), and the rollouts file holds each prompt n times."""
    manifest, _ = marked_manifest
    run_dir = tmp_path / "run"
    result = run_script("main_grpo.sh", *tiny_overrides(tiny_model_dir, run_dir, manifest), "trainer.total_steps=3",
                        "rollout.n=3", "algorithm.advantage=arena", "algorithm.arena.topology=round_robin",
                        "trainer.max_staleness=1")
    assert result.returncode == 0, result.stderr[-3000:]
    with open(run_dir / "rankings.csv") as f:
        rows = list(csv.DictReader(f))
    per_group = Counter((r["step"], r["group"]) for r in rows)
    assert {s for s, _ in per_group} == {"1", "2", "3"}
    assert set(per_group.values()) == {3}
    for step in range(1, 4):
        counts = Counter(line["sample_index"] for line in _rollouts(run_dir, step))
        assert set(counts.values()) == {3}
    assert max(m["async/staleness/max"] for m in metrics_lines(run_dir)[1:]) <= 1
