import numpy as np
import pytest
import torch

from rl_factory.algorithms.advantages import (
    ADVANTAGES,
    assign_advantages,
    compute_advantages,
    register_advantage,
)
from rl_factory.types import Group, Trajectory

# Group A rewards [1, 0, 0, 1]: mean 0.5, squared deviations sum to 4 * 0.25 = 1,
#   unbiased var = 1 / 3, std = 0.5773503, advantages = +-0.5 / 0.5773503 = +-0.8660254.
# Group B rewards [0, 0, 0, 1]: mean 0.25, squared deviations 3 * 0.0625 + 0.5625 = 0.75,
#   unbiased var = 0.75 / 3 = 0.25, std = 0.5, advantages = -0.25 / 0.5 = -0.5 and 0.75 / 0.5 = 1.5.
REWARDS = [1, 0, 0, 1, 0, 0, 0, 1]
GROUPS = [0, 0, 0, 0, 1, 1, 1, 1]
EXPECTED = [0.8660254, -0.8660254, -0.8660254, 0.8660254, -0.5, -0.5, -0.5, 1.5]


def test_grpo_hand_computed():
    adv = compute_advantages("grpo", REWARDS, GROUPS)
    assert adv.dtype == torch.float32 and adv.shape == (8,)
    torch.testing.assert_close(adv, torch.tensor(EXPECTED), atol=1e-5, rtol=0)


def test_grpo_accepts_tensors_arrays_and_string_ids_in_any_order():
    perm = [3, 6, 0, 5, 1, 7, 2, 4]
    ids = np.array(["a", "b"])[np.array(GROUPS)][perm]
    adv = compute_advantages("grpo", torch.tensor(REWARDS, dtype=torch.float64)[perm], ids)
    torch.testing.assert_close(adv, torch.tensor(EXPECTED)[perm], atol=1e-5, rtol=0)
    adv_np = compute_advantages("grpo", np.array(REWARDS)[perm], np.array(GROUPS)[perm])
    torch.testing.assert_close(adv_np, adv)


def test_grpo_singleton_and_zero_variance_groups_get_zero():
    adv = compute_advantages("grpo", [5.0, 1.0, 1.0, 1.0, 0.0, 2.0], [0, 1, 1, 1, 2, 2])
    # group 2: [0, 2], mean 1, unbiased std sqrt(2) -> -+1 / 1.4142136
    torch.testing.assert_close(adv, torch.tensor([0, 0, 0, 0, -0.7071068, 0.7071068]),
                               atol=1e-5, rtol=0)


def test_grpo_without_std_normalization_is_mean_centred():
    adv = compute_advantages("grpo", REWARDS, GROUPS, norm_by_std=False)
    torch.testing.assert_close(adv, torch.tensor([0.5, -0.5, -0.5, 0.5, -0.25, -0.25, -0.25, 0.75]))


def test_registry_errors():
    with pytest.raises(KeyError, match="unknown advantage estimator 'grpoo'; valid: .*'grpo'"):
        compute_advantages("grpoo", REWARDS, GROUPS)
    with pytest.raises(ValueError, match="already registered"):
        register_advantage("grpo")(lambda rewards, group_index: rewards)
    assert "grpo" in ADVANTAGES


def test_input_errors():
    with pytest.raises(ValueError, match="8 rewards but 3 group ids"):
        compute_advantages("grpo", REWARDS, [0, 0, 1])
    with pytest.raises(ValueError, match=r"indices \[1\] are not finite"):
        compute_advantages("grpo", [0.0, float("nan")], [0, 0])
    assert compute_advantages("grpo", [], []).shape == (0,)


def test_assign_advantages_sets_trajectories():
    def traj(reward):
        return Trajectory(sample_index=0, prompt_ids=[], token_ids=[], loss_mask=[], logprobs=[],
                          messages=[], turns=[], stop_reason="stop", reward=reward)

    groups = [Group(0, [traj(r) for r in REWARDS[:4]]), Group(1, [traj(r) for r in REWARDS[4:]])]
    assign_advantages("grpo", groups)
    got = [t.advantage for g in groups for t in g.trajectories]
    assert got == pytest.approx(EXPECTED, abs=1e-5)
