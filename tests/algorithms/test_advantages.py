import numpy as np
import pytest
import torch

from rl_factory.algorithms.advantages import (
    ADVANTAGES,
    assign_advantages,
    compute_advantages,
    register_advantage,
    required_inputs,
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
        register_advantage("grpo")(lambda inputs: inputs.rewards)
    with pytest.raises(ValueError, match="unknown inputs \\['critic'\\]"):
        register_advantage("needs_critic", requires=("critic",))
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


# ---- Dr. GRPO, RLOO, REINFORCE++ (same REWARDS / GROUPS as above) --------------------------------

def test_dr_grpo_is_grpo_without_std():
    adv = compute_advantages("dr_grpo", REWARDS, GROUPS)
    torch.testing.assert_close(adv, compute_advantages("grpo", REWARDS, GROUPS, norm_by_std=False))


def test_rloo_hand_computed():
    # Group A: 1 - mean(0, 0, 1) = 2/3, 0 - mean(1, 0, 1) = -2/3.
    # Group B: 0 - mean(0, 0, 1) = -1/3, 1 - mean(0, 0, 0) = 1.
    adv = compute_advantages("rloo", REWARDS, GROUPS)
    torch.testing.assert_close(adv, torch.tensor([2 / 3, -2 / 3, -2 / 3, 2 / 3, -1 / 3, -1 / 3, -1 / 3, 1.0]))
    assert compute_advantages("rloo", [3.0, 1.0, 2.0], [0, 1, 1]).tolist() == [0.0, -1.0, 1.0]


def test_reinforce_pp_hand_computed():
    # Centred: [.5, -.5, -.5, .5, -.25, -.25, -.25, .75]; batch mean 0; unbiased variance
    # (4 * .25 + 3 * .0625 + .5625) / 7 = 0.25, so every value doubles.
    adv = compute_advantages("reinforce_pp", REWARDS, GROUPS)
    torch.testing.assert_close(adv, torch.tensor([1.0, -1.0, -1.0, 1.0, -0.5, -0.5, -0.5, 1.5]))


def test_reinforce_pp_with_mask_whitens_over_tokens():
    lengths = [3, 1, 2, 1, 4, 1, 1, 2]
    mask = torch.zeros(8, 4)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
    adv = compute_advantages("reinforce_pp", REWARDS, GROUPS, response_mask=mask)
    # Reference: repeat each centred reward once per token and whiten that flat list with torch.std.
    centred = compute_advantages("dr_grpo", REWARDS, GROUPS).double()
    tokens = torch.cat([centred[i].repeat(n) for i, n in enumerate(lengths)])
    expected = (centred - tokens.mean()) / torch.sqrt(tokens.var() + 1e-8)
    torch.testing.assert_close(adv, expected.float())


# ---- GAE and arena -------------------------------------------------------------------------------

def test_gae_hand_computed_skips_masked_tokens():
    # Row 0: [prompt, gen, tool output, gen]; reward 1 on the last generated token; gamma .9, lam .8.
    #   t=3: delta = 1 - .25 = .75 -> A = .75
    #   t=2: masked, the chain jumps over it (next value stays .25)
    #   t=1: delta = .9 * .25 - .5 = -.275; A = -.275 + .9 * .8 * .75 = .265
    # Row 1: [gen, gen, pad, pad], reward 0, values [.2, .1]:
    #   t=1: delta = -.1 -> A = -.1; t=0: delta = .9 * .1 - .2 = -.11; A = -.11 + .72 * -.1 = -.182
    mask = torch.tensor([[0, 1, 0, 1], [1, 1, 0, 0]])
    values = torch.tensor([[9.0, 0.5, 9.0, 0.25], [0.2, 0.1, 7.0, 7.0]])
    adv = compute_advantages("gae", [1.0, 0.0], [0, 1], values=values, response_mask=mask, gamma=0.9,
                             lam=0.8, whiten_advantages=False)
    torch.testing.assert_close(adv, torch.tensor([[0, 0.265, 0, 0.75], [-0.182, -0.1, 0, 0]]))
    token_rewards = torch.tensor([[0, 0, 0, 1.0], [0, 0, 0, 0]])
    explicit = compute_advantages("gae", [1.0, 0.0], [0, 1], token_rewards=token_rewards, values=values,
                                  response_mask=mask, gamma=0.9, lam=0.8, whiten_advantages=False)
    torch.testing.assert_close(explicit, adv)
    whitened = compute_advantages("gae", [1.0, 0.0], [0, 1], values=values, response_mask=mask, gamma=0.9, lam=0.8)
    picked = adv[mask.bool()].double()
    expected = (picked - picked.mean()) / torch.sqrt(picked.var() + 1e-8)
    torch.testing.assert_close(whitened[mask.bool()], expected.float())
    assert whitened[~mask.bool()].abs().max() == 0


def test_token_level_estimators_need_their_inputs():
    assert required_inputs("gae") == ("values", "response_mask")
    assert required_inputs("grpo") == ()
    with pytest.raises(ValueError, match=r"'gae' needs \['values', 'response_mask'\]"):
        compute_advantages("gae", REWARDS, GROUPS)
    with pytest.raises(ValueError, match="token-level inputs disagree"):
        compute_advantages("gae", [1.0], [0], values=torch.zeros(1, 3), response_mask=torch.ones(1, 2))
    with pytest.raises(ValueError, match="values has 1 rows for 2 rewards"):
        compute_advantages("gae", [1.0, 0.0], [0, 0], values=torch.zeros(1, 3), response_mask=torch.ones(1, 3))


def test_arena_zscores_scores_within_groups():
    # Scores [1, 2/3, 1/3, 0]: mean .5, unbiased std sqrt((.25 + 1/36 + 1/36 + .25) / 3) = 0.4303315.
    scores = [1.0, 2 / 3, 1 / 3, 0.0, 0.5, 0.5]
    adv = compute_advantages("arena", [0.0] * 6, [0, 0, 0, 0, 1, 1], scores=scores)
    std = 0.4303315
    torch.testing.assert_close(adv, torch.tensor([0.5 / std, 1 / 6 / std, -1 / 6 / std, -0.5 / std, 0, 0]),
                               atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match=r"'arena' needs \['scores'\]"):
        compute_advantages("arena", REWARDS, GROUPS)


# ---- parity with verl's own estimators (verl is a heavy optional extra) ----------------------------

def test_parity_with_verl_grpo_and_rloo():
    core_algos = pytest.importorskip("verl.trainer.ppo.core_algos",
                                     reason="verl is not installed (bash setup.sh --dev (verl-cpu) to run this parity test)")
    gen = torch.Generator().manual_seed(0)
    for trial in range(5):
        groups, n, width = 6, 2 + trial, 7
        rewards = torch.randn(groups * n, generator=gen, dtype=torch.float64)
        index = np.repeat(np.arange(groups), n)[torch.randperm(groups * n, generator=gen).numpy()]
        lengths = torch.randint(1, width + 1, (groups * n,), generator=gen)
        mask = (torch.arange(width).expand(groups * n, width) < lengths.unsqueeze(-1)).float()
        token_rewards = torch.zeros(groups * n, width)
        token_rewards[torch.arange(groups * n), lengths - 1] = rewards.float()
        cases = [("grpo", core_algos.compute_grpo_outcome_advantage, {}, {}),
                 ("dr_grpo", core_algos.compute_grpo_outcome_advantage, {"norm_adv_by_std_in_grpo": False}, {}),
                 ("rloo", core_algos.compute_rloo_outcome_advantage, {}, {}),
                 ("reinforce_pp", core_algos.compute_reinforce_plus_plus_baseline_outcome_advantage, {},
                  {"response_mask": mask})]
        for name, verl_fn, verl_kwargs, ours_kwargs in cases:
            theirs, _ = verl_fn(token_level_rewards=token_rewards.clone(), response_mask=mask, index=index,
                                **verl_kwargs)
            ours = compute_advantages(name, token_rewards.sum(-1), index, **ours_kwargs)
            torch.testing.assert_close(ours.unsqueeze(-1) * mask, theirs * mask, atol=1e-6, rtol=0, msg=name)


def test_parity_with_verl_gae():
    core_algos = pytest.importorskip("verl.trainer.ppo.core_algos",
                                     reason="verl is not installed (bash setup.sh --dev (verl-cpu) to run this parity test)")
    gen = torch.Generator().manual_seed(1)
    mask = (torch.rand(8, 12, generator=gen) > 0.3).float()  # holes = tool observations
    values, token_rewards = torch.randn(8, 12, generator=gen), torch.randn(8, 12, generator=gen) * mask
    theirs, _ = core_algos.compute_gae_advantage_return(token_rewards, values, mask, gamma=0.95, lam=0.9)
    ours = compute_advantages("gae", torch.zeros(8), range(8), token_rewards=token_rewards, values=values,
                              response_mask=mask, gamma=0.95, lam=0.9)
    torch.testing.assert_close(ours, theirs * mask, atol=1e-5, rtol=0)


@pytest.mark.parametrize("name", ["grpo", "reinforce_pp"])
def test_huge_finite_rewards_give_the_same_z_scores(name):
    # the mean of two 1e308s, or the square of 1e155, overflowed: NaN or silently all-zero advantages
    unit = compute_advantages(name, [1.0, 0.0, 0.0, -0.5], [0, 0, 0, 0])
    for scale in (1e155, 1e300):
        huge = compute_advantages(name, [scale, 0.0, 0.0, -scale / 2], [0, 0, 0, 0])
        torch.testing.assert_close(huge, unit, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["dr_grpo", "rloo"])
def test_linear_advantages_past_float32_are_an_error_not_inf(name):
    unit = compute_advantages(name, [1.0, 0.0, 0.0, -0.5], [0, 0, 0, 0])
    torch.testing.assert_close(compute_advantages(name, [1e30, 0.0, 0.0, -5e29], [0, 0, 0, 0]) / 1e30, unit)
    with pytest.raises(ValueError, match=f"advantage estimator '{name}' gave non-finite advantages"):
        compute_advantages(name, [1e155, 0.0, 0.0, -5e154], [0, 0, 0, 0])


def test_non_finite_advantages_are_an_error_naming_the_estimator():
    with pytest.raises(ValueError, match=r"advantage estimator 'grpo' gave non-finite advantages for trajectories "
                                         r"\[0, 1\]"):
        compute_advantages("grpo", [1.0, 1.0], [0, 0], epsilon=0.0)
