"""Off-policy correction (rl_factory/algorithms/correction.py): hand-computed TIS and MIS weights, token and
sequence level, the loss they give, and the capability table's refusals of what cannot be exact."""
import math

import pytest
import torch

from rl_factory import capabilities
from rl_factory.algorithms.correction import CorrectionConfig, check_correction, correct_advantages
from rl_factory.algorithms.losses import ppo_clip_loss, ppo_clip_terms
from rl_factory.config import ConfigError

# one sample: a prompt token (mask 0) then three generated tokens with pi_old / pi_b = 5, 1, 0.25
OLD = torch.log(torch.tensor([[0.7, 0.5, 0.9, 0.1]]))
BEHAVIOUR = torch.log(torch.tensor([[0.3, 0.1, 0.9, 0.4]]))
MASK = torch.tensor([[0.0, 1.0, 1.0, 1.0]])
ADV = torch.tensor([2.0])


def weights(kind, level="token", threshold=2.0):
    adv, metrics = correct_advantages(CorrectionConfig(kind, level, threshold), ADV, OLD, BEHAVIOUR, MASK)
    return (adv / ADV).squeeze(0).tolist(), metrics


def test_tis_token_caps_each_weight():
    w, m = weights("tis")
    assert w == pytest.approx([0.0, 2.0, 1.0, 0.25])  # 5 -> 2; prompt token: no weight
    assert m["correction/truncated_fraction"] == pytest.approx(1 / 3)
    assert m["correction/raw_weight_max"] == pytest.approx(5.0)
    assert m["correction/log_ratio_mean"] == pytest.approx((math.log(5) + 0 + math.log(0.25)) / 3)


def test_mis_token_masks_weights_outside_the_bounds():
    w, m = weights("mis")
    assert w == pytest.approx([0.0, 0.0, 1.0, 0.0])  # 5 > 2 and 0.25 < 1/2 are masked
    assert m["correction/masked_fraction"] == pytest.approx(2 / 3)
    w, _ = weights("mis", threshold=8.0)
    assert w == pytest.approx([0.0, 5.0, 1.0, 0.25])  # inside [1/8, 8]: the raw weights


def test_sequence_level_is_one_weight_per_sample():
    # the product over generated tokens: 5 * 1 * 0.25 = 1.25
    w, _ = weights("tis", "sequence")
    assert w == pytest.approx([0.0, 1.25, 1.25, 1.25])
    w, _ = weights("mis", "sequence", threshold=1.2)
    assert w == pytest.approx([0.0, 0.0, 0.0, 0.0])


def test_weighted_advantages_weight_each_tokens_ppo_clip_loss():
    """max(-A w r, -A w clip(r)) = w max(-A r, -A clip(r)) for w >= 0: weighting advantages is weighting losses."""
    logprobs = OLD + torch.tensor([[0.0, 0.3, -0.3, 0.05]])
    adv, _ = correct_advantages(CorrectionConfig("tis"), ADV, OLD, BEHAVIOUR, MASK)
    loss, _ = ppo_clip_loss(logprobs, OLD, adv, MASK)
    terms, _ = ppo_clip_terms(logprobs, OLD, ADV, MASK)
    w = torch.tensor([[0.0, 2.0, 1.0, 0.25]])
    assert float(loss) == pytest.approx(float((terms * w * MASK).sum() / MASK.sum()))


def test_bad_settings_are_one_line_errors():
    with pytest.raises(Exception, match="tis"):
        check_correction(CorrectionConfig("tiss"))
    with pytest.raises(ConfigError, match="algorithm.correction.level"):
        check_correction(CorrectionConfig("tis", "turn"))
    with pytest.raises(ConfigError, match="must be > 1"):
        check_correction(CorrectionConfig("mis", threshold=0.5))


@pytest.mark.parametrize("backend, facts, refused", [
    ("embedded", {"algorithm.correction.type": "tis", capabilities.OPTIMIZER_STEPS: 2}, "optim.ppo_epochs=1"),
    ("embedded", {"algorithm.correction.type": "mis", "algorithm.old_log_probs": "rollout"}, "old_log_probs=auto"),
    ("embedded", {"algorithm.old_log_probs": "update", "trainer.max_staleness": 2,
                  "algorithm.correction.type": "none"}, "would train as if"),
    ("verl", {"trainer.partial_rollouts": False, "trainer.max_staleness": 1}, "partial rollouts always"),
    ("verl", {"trainer.max_staleness": 1, "trainer.use_v1": False}, "trainer.use_v1=true"),
])
def test_inexact_combinations_are_refused_in_one_line(backend, facts, refused):
    with pytest.raises(capabilities.Unsupported, match=refused) as info:
        capabilities.check(backend, facts)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("backend, facts", [
    ("embedded", {"algorithm.correction.type": "tis", capabilities.OPTIMIZER_STEPS: 1,
                  "algorithm.old_log_probs": "auto", "trainer.max_staleness": 2}),
    ("embedded", {"algorithm.old_log_probs": "update", "trainer.max_staleness": 0, "algorithm.correction.type": "none"}),
    ("embedded", {"trainer.partial_rollouts": False, "trainer.max_staleness": 1}),
    ("verl", {"trainer.partial_rollouts": False, "trainer.max_staleness": 0}),
])
def test_exact_combinations_pass(backend, facts):
    capabilities.check(backend, facts)
