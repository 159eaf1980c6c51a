import math

import pytest
import torch

from rl_factory.algorithms.losses import POLICY_LOSSES, get_policy_loss, kl_penalty

# Two sequences, T = 3, clip range [0.8, 1.2]; per-token loss = max(-A r, -A clip(r)).
# seq 0, A = +1, ratios [1, 1.5, 0.5]:  losses [-1, -1.2 (clipped), -0.5]
# seq 1, A = -2, ratios [1.5, 0.5, pad]: losses [3.0, 1.6 (clipped)], third token masked out
RATIOS = torch.tensor([[1.0, 1.5, 0.5], [1.5, 0.5, 1.0]])
OLD = torch.full((2, 3), -1.0)
MASK = torch.tensor([[1, 1, 1], [1, 1, 0]])
ADV = torch.tensor([1.0, -2.0])


def run(agg="token_mean", advantages=ADV):
    logprobs = (OLD + RATIOS.log()).requires_grad_()
    loss, metrics = POLICY_LOSSES["ppo_clip"](logprobs, OLD, advantages, MASK, agg=agg)
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
