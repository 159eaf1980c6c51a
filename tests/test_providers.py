"""Estimators name their inputs, providers fill them (rl_factory/providers.py).

The first test adds, here and nowhere else, an estimator that needs an input nothing in rl_factory knows
(`response_length`: each trajectory's generated tokens) and the one provider that fills it, then trains
two embedded steps with it: the trainer and the verl plugin are not touched, and the verl launcher
refuses the estimator in one line because verl's estimator call cannot give that input.
"""
from __future__ import annotations

import json

import pytest
import torch

from rl_factory.algorithms.advantages import (ADVANTAGES, INPUT_DIMS, REQUIRED_INPUTS, USED_INPUTS, group_zscore,
                                              register_advantage)
from rl_factory.config import ConfigError, load_config
from rl_factory.providers import PROVIDERS, Provider, ProviderContext, StepBatch, build_providers, register_provider
from rl_factory.update import AlgorithmConfig
from tests.records import jsonl

ESTIMATOR, INPUT = "test_shorter_is_better", "response_length"
FILLED: list[list[float]] = []  # what the provider gave, step by step


@pytest.fixture
def length_estimator():
    """The new input's provider and an estimator requiring it (removed again: the registries are global)."""

    @register_provider(INPUT, dims=1)
    class ResponseLength(Provider):
        def fill(self, batch: StepBatch) -> list[float]:
            FILLED.append([float(t.num_generated_tokens) for t in batch.trajs])
            return FILLED[-1]

    @register_advantage(ESTIMATOR, requires=(INPUT,))
    def shorter_is_better(inputs, epsilon: float = 1e-6) -> torch.Tensor:
        """The negated response length z-scored within the group: the shorter rollouts are reinforced."""
        return group_zscore(-inputs.response_length, inputs.group_index, epsilon=epsilon)

    FILLED.clear()
    yield
    for registry in (ADVANTAGES, REQUIRED_INPUTS, USED_INPUTS):
        del registry[ESTIMATOR]
    del PROVIDERS[INPUT], INPUT_DIMS[INPUT]


@pytest.mark.slow  # a real training run
def test_a_new_estimator_with_a_new_input_trains_with_one_provider(length_estimator, tiny_model_dir, tmp_path):
    from rl_factory.trainer import train

    run_dir = tmp_path / "run"
    cfg = load_config("grpo", [f"model.path={tiny_model_dir}", "model.device=cpu", "trainer.total_steps=2",
                               "data.train_batch_size=2", "rollout.n=4", "data.val_limit=2", "env.max_turns=2",
                               "rollout.max_response_tokens=32", f"trainer.output_dir={run_dir}",
                               "trainer.eval_every=0", "trainer.save_every=0", "trainer.report=false",
                               "trainer.progress=false", f"algorithm.advantage={ESTIMATOR}"])
    train(cfg)

    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == [0, 1, 2]
    assert len(FILLED) == 2 and all(len(step) == 8 for step in FILLED)  # once a step, every kept trajectory
    for step in (1, 2):
        records = jsonl(run_dir / "rollouts" / f"step_{step:06d}.jsonl")
        by_prompt: dict[int, list[dict]] = {}
        for r in records:
            by_prompt.setdefault(r["sample_index"], []).append(r)
        for group in by_prompt.values():
            lengths = torch.tensor([float(r["generated_tokens"]) for r in group], dtype=torch.float64)
            expected = group_zscore(-lengths, torch.zeros(len(group), dtype=torch.long))
            assert [r["advantage"] for r in group] == pytest.approx(expected.tolist(), abs=1e-5)
        trained = any(r["advantage"] != 0 for r in records)
        assert ("actor/loss" in lines[step]) == trained and lines[step]["actor/trained_fraction"] == \
            pytest.approx(sum(r["advantage"] != 0 for r in records) / len(records))
    assert any(r != 0 for step in FILLED for r in step)


def test_the_verl_launcher_refuses_an_estimator_whose_input_verl_cannot_give(length_estimator):
    pytest.importorskip("verl")
    from rl_factory.backends.verl import plugin
    from rl_factory.backends.verl.launcher import check_plugin

    assert not plugin.verl_fills(ESTIMATOR) and plugin.verl_fills("arena") and not plugin.verl_fills("gae")
    with pytest.raises(ConfigError, match=rf"'{ESTIMATOR}' requires \['{INPUT}'\], which verl's estimator call "
                                          "cannot give"):
        check_plugin(ESTIMATOR, "ppo_clip")


def test_an_estimator_whose_input_has_no_provider_is_refused_up_front():
    register_advantage("test_needs_nothing_known", requires=("scores",))(lambda inputs: inputs.scores)
    saved = PROVIDERS.pop("scores")
    try:
        with pytest.raises(ConfigError, match=r"'test_needs_nothing_known' requires \['scores'\], which no provider"):
            build_providers(ProviderContext(AlgorithmConfig(advantage="test_needs_nothing_known")))
    finally:
        PROVIDERS["scores"] = saved
        for registry in (ADVANTAGES, REQUIRED_INPUTS, USED_INPUTS):
            del registry["test_needs_nothing_known"]


def test_each_estimator_gets_exactly_the_providers_of_what_it_declares():
    from rewards.combine import RewardConfig
    from rewards.scorer import build_scorer

    def inputs(advantage: str) -> list[str]:  # the tournament's judge compares the rewards: it needs the scorer
        ctx = ProviderContext(AlgorithmConfig(advantage=advantage), build_scorer(RewardConfig()))
        return list(build_providers(ctx).by_input)

    assert inputs("grpo") == inputs("rloo") == inputs("reinforce_pp") == []
    assert inputs("arena") == ["scores"]
    assert inputs("gae") == ["values", "response_mask", "token_rewards"]  # requires, then uses


def test_a_new_input_must_be_declared_before_an_estimator_requires_it():
    with pytest.raises(ValueError, match=r"requires unknown inputs \['not_declared'\]"):
        register_advantage("test_undeclared", requires=("not_declared",))
    assert "test_undeclared" not in ADVANTAGES
