"""The KL reference model exists only when the KL penalty is on, and the penalty cannot be on without it."""
import pytest
import torch

from rl_factory.update import AlgorithmConfig, OptimConfig, load_reference, update_policy


def test_no_reference_model_without_kl():
    model = torch.nn.Linear(3, 2)
    assert load_reference(model, AlgorithmConfig(kl_coef=0.0)) is None


def test_reference_model_is_a_frozen_copy_when_kl_is_on():
    model = torch.nn.Linear(3, 2)
    ref = load_reference(model, AlgorithmConfig(kl_coef=0.05))
    assert ref is not model and not ref.training
    assert all(not p.requires_grad for p in ref.parameters())
    assert all(p.requires_grad for p in model.parameters())
    with torch.no_grad():
        model.weight.add_(1.0)  # training the policy leaves the reference where it was
    assert not torch.equal(ref.weight, model.weight)


def test_kl_on_without_reference_is_an_error():
    with pytest.raises(ValueError, match="kl_coef=0.1 needs a reference model"):
        update_policy(None, None, None, [], AlgorithmConfig(kl_coef=0.1), OptimConfig(), ref_model=None)
