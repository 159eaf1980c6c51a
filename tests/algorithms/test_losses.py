import math

import pytest
import torch

from rl_factory.algorithms.losses import POLICY_LOSSES, aggregate_loss, get_policy_loss, kl_penalty

# Two sequences, T = 3, clip range [0.8, 1.2]; per-token loss = max(-A r, -A clip(r)).
# seq 0, A = +1, ratios [1, 1.5, 0.5]:  losses [-1, -1.2 (clipped), -0.5]
# seq 1, A = -2, ratios [1.5, 0.5, pad]: losses [3.0, 1.6 (clipped)], third token masked out
RATIOS = torch.tensor([[1.0, 1.5, 0.5], [1.5, 0.5, 1.0]])
OLD = torch.full((2, 3), -1.0)
MASK = torch.tensor([[1, 1, 1], [1, 1, 0]])
ADV = torch.tensor([1.0, -2.0])


def run(agg="token_mean", advantages=ADV, norm_length=None):
    logprobs = (OLD + RATIOS.log()).requires_grad_()
    loss, metrics = POLICY_LOSSES["ppo_clip"](logprobs, OLD, advantages, MASK, agg=agg, norm_length=norm_length)
    return logprobs, loss, metrics


def test_ppo_clip_token_mean_hand_computed():
    logprobs, loss, metrics = run()
    assert loss.item() == pytest.approx((-1 - 1.2 - 0.5 + 3.0 + 1.6) / 5)  # 0.38
    assert metrics["clipfrac"] == pytest.approx(2 / 5)
    assert metrics["ratio_mean"] == pytest.approx(1.0)
    assert metrics["approx_kl"] == pytest.approx(-2 * math.log(0.75) / 5)
    loss.backward()
    # d(-A r)/d logp = -A r / 5 on unclipped tokens; clipped and masked tokens get no gradient
    expected_grad = torch.tensor([[-1.0, 0.0, -0.5], [3.0, 0.0, 0.0]]) / 5
    torch.testing.assert_close(logprobs.grad, expected_grad)


@pytest.mark.parametrize("agg, expected", [
    ("seq_mean_token_mean", (-2.7 / 3 + 4.6 / 2) / 2),      # 0.7
    ("seq_mean_token_sum_norm", (-2.7 / 3 + 4.6 / 3) / 2),  # 0.3166667
])
def test_ppo_clip_aggregations(agg, expected):
    assert run(agg)[1].item() == pytest.approx(expected)


def test_per_token_advantages_match_broadcast():
    per_token = ADV.unsqueeze(-1).expand(2, 3)
    assert run(advantages=per_token)[1].item() == pytest.approx(run()[1].item())


def test_registry_and_agg_errors():
    with pytest.raises(KeyError, match="valid: .*'ppo_clip'"):
        get_policy_loss("ppo")
    with pytest.raises(KeyError, match="unknown loss aggregation 'sum'"):
        run(agg="sum")


def test_kl_penalty_estimators():
    logp, ref = torch.tensor([[math.log(0.5)]]), torch.tensor([[math.log(0.25)]])
    assert kl_penalty(logp, ref, "k1").item() == pytest.approx(math.log(2))
    assert kl_penalty(logp, ref, "k2").item() == pytest.approx(0.5 * math.log(2) ** 2)
    # k3 = exp(ref - logp) - (ref - logp) - 1 = 0.5 + ln 2 - 1
    assert kl_penalty(logp, ref).item() == pytest.approx(0.5 + math.log(2) - 1)
    assert kl_penalty(logp, ref, "k3").item() == kl_penalty(logp, ref).item()
    assert kl_penalty(torch.tensor([[-40.0]]), torch.tensor([[-10.0]])).item() == 10.0  # clamped
    with pytest.raises(KeyError, match="valid: .*'low_var_kl'"):
        kl_penalty(logp, ref, "k4")


def test_asymmetric_clip_higher():
    # DAPO clip-higher: range [1 - 0.2, 1 + 0.28]. A = +1: ratio 1.25 is inside (loss -1.25), ratio 1.4
    # is clipped to 1.28. A = -1: ratio 0.7 is clipped to 0.8 (loss 0.8), ratio 1.4 is not (loss 1.4).
    ratios = torch.tensor([[1.25, 1.4], [0.7, 1.4]])
    old = torch.zeros(2, 2)
    logprobs = ratios.log().requires_grad_()
    loss, metrics = POLICY_LOSSES["ppo_clip"](logprobs, old, torch.tensor([1.0, -1.0]), torch.ones(2, 2),
                                              clip_ratio_low=0.2, clip_ratio_high=0.28)
    assert loss.item() == pytest.approx((-1.25 - 1.28 + 0.8 + 1.4) / 4)
    assert metrics["clipfrac"] == pytest.approx(2 / 4)
    loss.backward()
    torch.testing.assert_close(logprobs.grad, torch.tensor([[-1.25, 0.0], [0.0, 1.4]]) / 4)
    # The symmetric default would clip the 1.25 token too.
    symmetric, _ = POLICY_LOSSES["ppo_clip"](ratios.log(), old, torch.tensor([1.0, -1.0]), torch.ones(2, 2))
    assert symmetric.item() == pytest.approx((-1.2 - 1.2 + 0.8 + 1.4) / 4)


def test_dr_grpo_constant_normalizer():
    # seq_mean_token_sum_norm with a fixed norm_length: each sequence's token sum over 10, then the
    # mean over sequences; independent of how many tokens each sequence actually has.
    assert run("seq_mean_token_sum_norm", norm_length=10)[1].item() == pytest.approx((-2.7 / 10 + 4.6 / 10) / 2)
    # A fully masked row still counts as a sequence (its sum is 0): the normalizer is constant.
    loss_mat, mask = torch.tensor([[1.0, 2.0], [5.0, 5.0]]), torch.tensor([[1, 1], [0, 0]])
    assert aggregate_loss(loss_mat, mask, "seq_mean_token_sum_norm").item() == pytest.approx(3 / 2 / 2)
    # while the sequence mean ignores it and token_mean counts tokens.
    assert aggregate_loss(loss_mat, mask, "seq_mean_token_mean").item() == pytest.approx(1.5)
    assert aggregate_loss(loss_mat, mask, "token_mean").item() == pytest.approx(1.5)


def test_aggregations_weigh_long_sequences_differently():
    # Sequence 0: 4 tokens of loss 1; sequence 1: 1 token of loss 5.
    loss_mat = torch.tensor([[1.0, 1.0, 1.0, 1.0], [5.0, 0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 1], [1, 0, 0, 0]])
    assert aggregate_loss(loss_mat, mask, "token_mean").item() == pytest.approx(9 / 5)
    assert aggregate_loss(loss_mat, mask, "seq_mean_token_mean").item() == pytest.approx((1 + 5) / 2)
    assert aggregate_loss(loss_mat, mask, "seq_mean_token_sum_norm").item() == pytest.approx((4 / 4 + 5 / 4) / 2)


def test_kl_estimators_on_a_batch_with_mask():
    # log-ratios (policy - ref): 0.5, -0.5, 0 (masked). k1 = lr, k2 = lr^2 / 2, k3 = e^-lr + lr - 1.
    logp = torch.tensor([[0.5, -0.5, 0.0]])
    ref = torch.zeros(1, 3)
    mask = torch.tensor([[1, 1, 0]])
    k1 = aggregate_loss(kl_penalty(logp, ref, "k1"), mask)
    k2 = aggregate_loss(kl_penalty(logp, ref, "k2"), mask)
    k3 = aggregate_loss(kl_penalty(logp, ref, "k3"), mask)
    assert k1.item() == pytest.approx(0.0)
    assert k2.item() == pytest.approx(0.125)
    assert k3.item() == pytest.approx(((math.exp(-0.5) + 0.5 - 1) + (math.exp(0.5) - 0.5 - 1)) / 2)
    assert kl_penalty(ref, ref, "k3").abs().max().item() == 0.0
