"""Units of the embedded trainer: the policy update, batching, checkpoints and config slices.

The update tests use the real tiny model and hand-made trajectories whose old log-probs are the
model's own (on-policy, so PPO ratios start at 1), and check the direction of one optimizer step.
"""
import copy

import pytest
import torch

from rl_factory import checkpoint as ckpt
from rl_factory.config import ConfigError, load_config, section
from rl_factory.policy import ModelConfig, load_policy
from rl_factory.rollout import RolloutConfig
from rl_factory.types import Trajectory
from rl_factory.update import AlgorithmConfig, OptimConfig, collate, micro_batches, update_policy


@pytest.fixture(scope="module")
def base_policy(tiny_model_dir, calculator_tools):
    return load_policy(ModelConfig(path=str(tiny_model_dir), device="cpu"), calculator_tools, log=lambda *_: None)


@pytest.fixture
def policy(base_policy):
    """A fresh copy per test: updates must not leak between tests."""
    fresh = copy.copy(base_policy)
    fresh.model = copy.deepcopy(base_policy.model)
    return fresh


def make_traj(policy, question: str, response: str, advantage: float, index: int = 0) -> Trajectory:
    tok = policy.tokenizer
    prompt = tok.encode(tok.apply_chat_template([{"role": "user", "content": question}], tokenize=False,
                                                add_generation_prompt=True), add_special_tokens=False)
    generated = tok.encode(response, add_special_tokens=False) + [tok.eos_token_id]
    ids = prompt + generated
    mask = [0] * len(prompt) + [1] * len(generated)
    traj = Trajectory(sample_index=index, prompt_ids=prompt, token_ids=ids, loss_mask=mask,
                      logprobs=[0.0] * len(ids), messages=[], turns=[], stop_reason="answer",
                      advantage=advantage)
    traj.logprobs = [lp * m for lp, m in zip(response_logprobs(policy, [traj])[0], mask)]
    return traj


def response_logprobs(policy, trajs) -> list[list[float]]:
    b = collate(trajs, policy.tokenizer.pad_token_id, policy.device)
    with torch.no_grad():
        lps = policy.sequence_logprobs(b["input_ids"], b["attention_mask"])
    return [lps[i, : len(t.token_ids)].tolist() for i, t in enumerate(trajs)]


def mean_response_logprob(policy, traj) -> float:
    lps = response_logprobs(policy, [traj])[0]
    picked = [lp for lp, m in zip(lps, traj.loss_mask) if m]
    return sum(picked) / len(picked)


def constant_schedule(optimizer):
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)


def test_update_moves_logprobs_in_the_direction_of_the_advantage(policy):
    good = make_traj(policy, "What is 347 * 29?", "The answer is 10063.", advantage=1.0, index=0)
    bad = make_traj(policy, "What is 1234 + 5678?", "I think it is 7.", advantage=-1.0, index=1)
    before = {id(t): mean_response_logprob(policy, t) for t in (good, bad)}
    # Plain SGD with a large step (clipped to norm 1): one step is far enough to see, and small
    # enough to stay first-order (Adam at 1e-2 moves every weight of this tiny model too far).
    optimizer = torch.optim.SGD(policy.model.parameters(), lr=0.1)
    metrics = update_policy(policy, optimizer, constant_schedule(optimizer), [good, bad], AlgorithmConfig(),
                            OptimConfig(lr=0.1))
    assert mean_response_logprob(policy, good) > before[id(good)] + 0.02
    assert mean_response_logprob(policy, bad) < before[id(bad)] - 0.02
    assert metrics["actor/trained_fraction"] == 1.0
    assert metrics["actor/lr"] == pytest.approx(0.1)
    assert metrics["actor/ratio_mean"] == pytest.approx(1.0)  # on-policy old log-probs
    assert all(torch.isfinite(torch.tensor(v)) for v in metrics.values())


def test_update_skips_zero_advantage_trajectories_but_counts_their_tokens(policy, base_policy):
    """With plain SGD (no Adam scale invariance, no clipping) the step on [positive, zero] is the step
    on [positive] alone scaled by positive's share of the tokens: the zero-advantage trajectory is not
    computed (its loss is exactly 0) but stays in token_mean's denominator, as in DAPO, TRL and verl."""
    def step(trajs, lr=0.5):
        pol = copy.copy(base_policy)
        pol.model = copy.deepcopy(base_policy.model)
        optimizer = torch.optim.SGD(pol.model.parameters(), lr=lr)
        metrics = update_policy(pol, optimizer, constant_schedule(optimizer), trajs, AlgorithmConfig(),
                                OptimConfig(grad_clip=1e9))
        return pol, metrics

    pos = make_traj(policy, "What is 347 * 29?", "The answer is 10063.", advantage=1.0, index=0)
    zero = make_traj(policy, "What is 12 + 30?", "The answer is 42, I believe.", advantage=0.0, index=1)
    both, metrics = step([pos, zero])
    share = sum(pos.loss_mask) / (sum(pos.loss_mask) + sum(zero.loss_mask))
    assert 0 < share < 1
    alone, _ = step([pos], lr=0.5 * share)
    assert metrics["actor/trained_fraction"] == 0.5 and metrics["actor/samples"] == 1
    for p, q, orig in zip(both.model.parameters(), alone.model.parameters(), base_policy.model.parameters()):
        torch.testing.assert_close(p, q, atol=1e-6, rtol=1e-5)
    assert any(not torch.equal(p, o) for p, o in zip(both.model.parameters(), base_policy.model.parameters()))

    # Nothing to learn from: no forward pass, no optimizer step, parameters untouched.
    untouched, metrics = step([zero, copy.copy(zero)])
    assert metrics == {"actor/trained_fraction": 0.0}
    for p, o in zip(untouched.model.parameters(), base_policy.model.parameters()):
        assert torch.equal(p, o)


def test_update_mode_trains_against_the_updates_own_log_probs(policy, base_policy):
    """algorithm.old_log_probs=update: the recorded log-probs are ignored (here: deliberately stale, so that
    rollout mode clips) and the ratio is exactly 1; the step equals rollout mode's with exact old log-probs."""
    good = make_traj(policy, "What is 347 * 29?", "The answer is 10063.", advantage=1.0, index=0)
    stale = copy.copy(good)
    stale.logprobs = [lp - 0.5 * m for lp, m in zip(good.logprobs, good.loss_mask)]  # ratio e^0.5 > 1.2: clipped

    def step(traj, mode):
        pol = copy.copy(base_policy)
        pol.model = copy.deepcopy(base_policy.model)
        optimizer = torch.optim.SGD(pol.model.parameters(), lr=0.1)
        metrics = update_policy(pol, optimizer, constant_schedule(optimizer), [traj],
                                AlgorithmConfig(old_log_probs=mode), OptimConfig(grad_clip=1e9))
        return pol, metrics

    own, metrics = step(stale, "update")
    exact, _ = step(good, "rollout")
    clipped, clipped_metrics = step(stale, "rollout")
    assert metrics["actor/ratio_mean"] == 1.0 and metrics["actor/clipfrac"] == 0.0
    assert clipped_metrics["actor/clipfrac"] == 1.0
    for p, q in zip(own.model.parameters(), exact.model.parameters()):
        torch.testing.assert_close(p, q, atol=1e-6, rtol=1e-5)
    assert all(torch.equal(p, o) for p, o in zip(clipped.model.parameters(), base_policy.model.parameters()))


@pytest.mark.parametrize("overrides, message", [
    (["algorithm.old_log_probs=recompute"], "algorithm.old_log_probs=recompute is not supported on the embedded backend"),
    (["algorithm.old_log_probs=update", "optim.mini_batches=2"],
     "algorithm.old_log_probs=update is not supported on any backend with optimizer steps per batch=2"),
    (["algorithm.old_log_probs=often"], "algorithm.old_log_probs"),
])
def test_embedded_old_log_probs_modes_it_cannot_honour_are_refused(overrides, message):
    from rl_factory.update import old_log_probs_mode

    cfg = load_config("grpo", overrides)
    with pytest.raises(ConfigError, match=message):
        old_log_probs_mode(section(cfg, "algorithm", AlgorithmConfig), section(cfg, "optim", OptimConfig))


def test_micro_batches_bucket_by_length_under_a_token_budget():
    class Sample:
        def __init__(self, n):
            self.token_ids = [0] * n

    lengths = [30, 500, 31, 29, 120, 33, 118, 30]
    samples = [Sample(n) for n in lengths]
    batches = micro_batches(samples, max_rows=64, max_tokens=256)
    assert sorted(len(s.token_ids) for b in batches for s in b) == sorted(lengths)  # nothing lost
    for b in batches:
        widths = [len(s.token_ids) for s in b]
        assert len(b) * max(widths) <= 256 or len(b) == 1
    # the long trajectory pads nobody but itself; the short ones share one micro-batch
    assert [len(s.token_ids) for s in batches[-1]] == [500]
    assert sorted(len(s.token_ids) for s in batches[0]) == [29, 30, 30, 31, 33]
    padded = sum(len(b) * max(len(s.token_ids) for s in b) for b in batches)
    assert padded < 1.1 * sum(lengths)  # vs. 8 * 500 = 4000 padded to the longest
    rows_only = micro_batches(samples, max_rows=3, max_tokens=None)
    assert sorted(len(s.token_ids) for b in rows_only for s in b) == sorted(lengths)
    assert max(len(b) for b in rows_only) == 3 and [len(s.token_ids) for s in rows_only[-1]] == [500]


def test_a_long_sample_does_not_widen_short_ones_that_would_fit_beside_it():
    """87 samples of 107 tokens and one of 317 (a step of the default job): filling micro-batches up to the
    budget put the long one with the last 23 short ones (24 rows padded to 317: 14456 padded tokens
    for 9626). The split pays for padding and for each extra micro-batch, so the long one goes alone."""
    class Sample:
        def __init__(self, n):
            self.token_ids = [0] * n

    samples = [Sample(107) for _ in range(87)] + [Sample(317)]
    batches = micro_batches(samples, max_rows=64, max_tokens=8192)
    assert [len(s.token_ids) for s in batches[-1]] == [317]
    assert all(max(len(s.token_ids) for s in b) == 107 for b in batches[:-1])
    assert all(len(b) <= 64 and len(b) * 107 <= 8192 for b in batches[:-1]) and len(batches) == 3
    assert sum(len(b) for b in batches) == 88


def test_bucketed_micro_batches_give_the_one_batch_gradient(policy, base_policy):
    """Splitting by length under a token budget changes the cost, not the update: with plain SGD the
    step equals the step of one micro-batch holding everything (token-weighted accumulation)."""
    def step(trajs, **optim):
        pol = copy.copy(base_policy)
        pol.model = copy.deepcopy(base_policy.model)
        optimizer = torch.optim.SGD(pol.model.parameters(), lr=0.5)
        update_policy(pol, optimizer, constant_schedule(optimizer), trajs, AlgorithmConfig(),
                      OptimConfig(grad_clip=1e9, **optim))
        return pol

    trajs = [make_traj(policy, "What is 347 * 29?", "The answer is 10063.", 1.0, 0),
             make_traj(policy, "Hi", "ok", -0.5, 1),
             make_traj(policy, "What is 1234 + 5678?", "Let me think. " * 12 + "6912.", -1.0, 2),
             make_traj(policy, "What is 2 + 2?", "4", 0.7, 3)]
    widths = sorted(len(t.token_ids) for t in trajs)
    budget = 2 * widths[1]  # the two shortest together, the others alone
    assert [len(b) for b in micro_batches(trajs, 64, budget)] == [2, 1, 1]
    split = step(trajs, micro_batch_tokens=budget)
    whole = step(trajs, micro_batch_tokens=None)
    moved = False
    for p, q, o in zip(split.model.parameters(), whole.model.parameters(), base_policy.model.parameters()):
        torch.testing.assert_close(p, q, atol=1e-6, rtol=1e-5)
        moved |= not torch.equal(p, o)
    assert moved


def test_collate_right_pads_into_aligned_tensors(policy):
    short = make_traj(policy, "Hi", "ok", advantage=0.5, index=0)
    long = make_traj(policy, "What is 347 * 29?", "The answer is 10063.", advantage=-1.5, index=1)
    pad = policy.tokenizer.pad_token_id
    b = collate([short, long], pad, torch.device("cpu"))
    width = len(long.token_ids)
    assert len(short.token_ids) < width
    for key in ("input_ids", "attention_mask", "loss_mask", "old_logprobs"):
        assert b[key].shape == (2, width), key
    assert b["advantages"].shape == (2,) and b["advantages"].tolist() == [0.5, -1.5]
    assert b["input_ids"].dtype == torch.long and b["loss_mask"].dtype == torch.float32
    n = len(short.token_ids)
    assert b["input_ids"][0, :n].tolist() == short.token_ids
    assert b["input_ids"][0, n:].tolist() == [pad] * (width - n)
    assert b["attention_mask"][0].tolist() == [1] * n + [0] * (width - n)
    assert b["loss_mask"][0].tolist() == short.loss_mask + [0.0] * (width - n)
    assert b["old_logprobs"][0, :n].tolist() == pytest.approx(short.logprobs)
    assert b["input_ids"][1].tolist() == long.token_ids and b["attention_mask"][1].all()


def test_checkpoints_are_atomic_and_pruned(tmp_path, base_policy):
    from transformers import AutoModelForCausalLM

    model, tok = base_policy.model, base_policy.tokenizer
    first = ckpt.save_checkpoint(tmp_path, 1, model, tok, {"note": "one"})
    assert first == tmp_path / "checkpoints" / "step_000001"
    assert ckpt.latest_checkpoint(tmp_path) == first
    # A run killed while saving step 2 leaves its temp dir (even with the state file written):
    leftover = tmp_path / "checkpoints" / ".tmp-step_000002"
    leftover.mkdir()
    (leftover / ckpt.STATE_FILE).write_bytes(b"partial")
    # ... and a step directory without the state file is not a checkpoint either:
    stateless = tmp_path / "checkpoints" / "step_000009"
    stateless.mkdir()
    assert ckpt.latest_checkpoint(tmp_path) == first
    stateless.rmdir()

    second = ckpt.save_checkpoint(tmp_path, 2, model, tok, {"note": "two"}, keep=0)
    assert ckpt.latest_checkpoint(tmp_path) == second and not leftover.exists()
    state = ckpt.load_trainer_state(second)
    assert state["step"] == 2 and state["note"] == "two" and "rng" in state
    loaded = AutoModelForCausalLM.from_pretrained(second)
    for p, q in zip(loaded.parameters(), model.parameters()):
        assert torch.equal(p, q)

    ckpt.save_checkpoint(tmp_path, 3, model, tok, {}, keep=2)
    kept = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert kept == ["step_000002", "step_000003"]
    assert ckpt.latest_checkpoint(tmp_path).name == "step_000003"


def test_section_names_an_unknown_key():
    cfg = section({"rollout": {"n": 2}}, "rollout", RolloutConfig)
    assert cfg.n == 2 and cfg.max_turns == RolloutConfig().max_turns
    with pytest.raises(ConfigError, match=r"rollout\.temprature") as err:
        section({"rollout": {"n": 2, "temprature": 0.5}}, "rollout", RolloutConfig)
    assert "temperature" in str(err.value)  # the valid keys are listed


def test_load_config_rejects_a_misspelled_key():
    with pytest.raises(ConfigError, match="totl_steps"):
        load_config("grpo", ["trainer.totl_steps=1"])
    cfg = load_config("grpo", ["trainer.total_steps=1", "rollout.n=3"])
    assert cfg.trainer.total_steps == 1 and cfg.rollout.n == 3


def test_a_non_finite_step_is_skipped_and_a_streak_stops_the_run(policy, base_policy):
    from rl_factory.update import NonFiniteGuard, NonFiniteUpdates

    good = make_traj(policy, "What is 347 * 29?", "The answer is 10063.", advantage=1.0, index=0)
    poisoned = make_traj(policy, "What is 1234 + 5678?", "I think it is 7.", advantage=float("nan"), index=1)
    optimizer = torch.optim.AdamW(policy.model.parameters(), lr=1e-2)
    guard = NonFiniteGuard(limit=2)
    metrics = update_policy(policy, optimizer, constant_schedule(optimizer), [good, poisoned], AlgorithmConfig(),
                            OptimConfig(), guard=guard)
    assert metrics["update/skipped_nonfinite"] == 1.0 and "actor/grad_norm" not in metrics
    for p, o in zip(policy.model.parameters(), base_policy.model.parameters()):
        assert torch.equal(p, o)  # not one weight moved, none became NaN
    metrics = update_policy(policy, optimizer, constant_schedule(optimizer), [good], AlgorithmConfig(),
                            OptimConfig(), guard=guard)  # a finite step resets the streak and trains
    assert metrics["update/skipped_nonfinite"] == 0.0 and guard.in_a_row == 0
    assert all(torch.isfinite(p).all() for p in policy.model.parameters())
    update_policy(policy, optimizer, constant_schedule(optimizer), [poisoned], AlgorithmConfig(), OptimConfig(),
                  guard=guard)
    with pytest.raises(NonFiniteUpdates, match=r"^2 optimizer steps in a row had a non-finite loss or gradient "
                                                r"norm \(nan\); each was skipped"):
        update_policy(policy, optimizer, constant_schedule(optimizer), [poisoned], AlgorithmConfig(),
                      OptimConfig(), guard=guard)
    assert all(torch.isfinite(p).all() for p in policy.model.parameters())
