"""The gae critic (value head, token rewards, GAE placement, value loss) and process rewards."""
import asyncio
import copy
import time

import pytest
import torch

from rewards.combine import RewardConfig
from rewards.loader import RewardError, RewardLoadError
from rewards.process import ProcessRewardConfig
from rewards.scorer import Scorer, build_scorer
from rl_factory.config import ConfigError
from rl_factory.components import SamplingConfig
from rl_factory.critic import (CriticConfig, ValueHead, ValueLoss, assign_with_critic, build_value_head, compute_values, token_rewards,
                               turn_end_positions)
from rl_factory.policy import ModelConfig, load_policy
from rl_factory.trainer import check_supported
from rl_factory.providers import ProviderContext, build_providers
from rl_factory.types import ToolCall, ToolResult, Trajectory, Turn
from rl_factory.update import AlgorithmConfig, OptimConfig, update_policy


def two_turn_traj(reward: float = 1.0, prompt_len: int = 3, ids_from: int = 10) -> Trajectory:
    """prompt (3) | turn 1: 4 generated + 2 observation | turn 2: 3 generated."""
    ok = ToolResult(ToolCall("add", {"a": 1}), "2")
    bad = ToolResult(ToolCall("add", None, error="parse"), "error", error_kind="parse")
    t1 = Turn(generated_ids=[ids_from + i for i in range(4)], logprobs=[-0.5] * 4, text="call",
              tool_calls=[ok.call, bad.call], tool_results=[ok, bad], observation_ids=[5, 6])
    t2 = Turn(generated_ids=[ids_from + 4 + i for i in range(3)], logprobs=[-0.5] * 3, text="<answer>2</answer>")
    prompt = list(range(1, prompt_len + 1))
    ids = prompt + t1.generated_ids + t1.observation_ids + t2.generated_ids
    mask = [0] * prompt_len + [1] * 4 + [0] * 2 + [1] * 3
    return Trajectory(sample_index=0, prompt_ids=prompt, token_ids=ids, loss_mask=mask,
                      logprobs=[-0.5 * m for m in mask], messages=[], turns=[t1, t2], stop_reason="answer",
                      reward=reward)


def _scorer(process: ProcessRewardConfig, **policy) -> Scorer:
    """A scorer whose outcome reward is the trajectory's preset reward, plus the given process rewards."""
    return build_scorer(RewardConfig(function="rewards.exact_match:numeric_exact_match", process=process, **policy))


async def _score_keeping_reward(scorer: Scorer, traj: Trajectory) -> list[float]:
    reward = traj.reward
    await scorer.score(traj)
    traj.reward = reward
    return traj.process_rewards


def test_process_and_outcome_rewards_sit_on_each_turns_last_generated_token(tmp_path):
    fn_file = tmp_path / "per_turn.py"
    fn_file.write_text("def per_turn(text, turn_index):\n    return 0.5 if 'answer' in text else 0.25\n")
    scorer = _scorer(ProcessRewardConfig(function=f"{fn_file}:per_turn", tool_error_penalty=-0.1))
    traj = two_turn_traj(reward=1.0)
    assert asyncio.run(_score_keeping_reward(scorer, traj)) == pytest.approx([0.25 - 0.1, 0.5])
    assert turn_end_positions(traj) == [6, 11]
    rewards = token_rewards(traj)
    assert rewards[6] == pytest.approx(0.15) and rewards[11] == pytest.approx(1.5)
    assert sum(r != 0 for r in rewards) == 2
    assert scorer.outcome(traj) == pytest.approx(1.65)
    ignore = _scorer(ProcessRewardConfig(tool_error_penalty=-0.1, outcome_mode="ignore"))
    assert ignore.outcome(traj) == 1.0
    with pytest.raises(RewardLoadError, match="outcome_mode"):
        _scorer(ProcessRewardConfig(outcome_mode="mean"))


def test_a_raising_per_turn_function_follows_on_error(tmp_path):
    fn_file = tmp_path / "per_turn.py"
    fn_file.write_text("def per_turn(text):\n    if 'answer' in text:\n        raise KeyError('boom')\n    return 0.25\n")
    spec = ProcessRewardConfig(function=f"{fn_file}:per_turn", tool_error_penalty=-0.1)
    with pytest.raises(RewardError, match="turn 1: KeyError"):
        asyncio.run(_scorer(spec).score(two_turn_traj()))
    zero = _scorer(spec, on_error="zero")
    traj = two_turn_traj()
    assert asyncio.run(_score_keeping_reward(zero, traj)) == pytest.approx([0.25 - 0.1, 0.0])
    assert zero.metrics([traj])["reward/process/errors"] == 1.0


def test_process_rewards_obey_the_timeout(tmp_path):
    """The per-turn function runs under reward.timeout_s like the outcome reward (it used to wait forever)."""
    fn_file = tmp_path / "per_turn.py"
    fn_file.write_text("import time\ndef per_turn(text):\n    time.sleep(3)\n    return 1.0\n")
    scorer = _scorer(ProcessRewardConfig(function=f"{fn_file}:per_turn"), executor="thread", timeout_s=0.2,
                     on_error="zero")
    traj = two_turn_traj()

    async def timed() -> tuple[list[float], float]:
        start = time.perf_counter()
        return await _score_keeping_reward(scorer, traj), time.perf_counter() - start

    rewards, seconds = asyncio.run(timed())  # (asyncio.run then waits for the abandoned threads)
    assert rewards == [0.0, 0.0] and seconds < 2
    assert traj.reward_info["process/errors"] == 2


def test_gae_token_advantages_only_on_generated_tokens():
    trajs = [two_turn_traj(1.0), two_turn_traj(0.0)]
    trajs[1].process_rewards = [-0.1, 0.0]
    values = [[0.0] * len(t.token_ids) for t in trajs]
    metrics = assign_with_critic("gae", trajs, values, gamma=1.0, lam=1.0, whiten_advantages=False)
    for t in trajs:
        assert len(t.token_advantages) == len(t.token_ids) == len(t.returns) == len(t.old_values)
        assert all(a == 0.0 for a, m in zip(t.token_advantages, t.loss_mask) if not m)
    # V = 0, gamma = lam = 1: every generated token's advantage is the reward still to come.
    assert [a for a, m in zip(trajs[0].token_advantages, trajs[0].loss_mask) if m] == pytest.approx([1.0] * 7)
    assert [a for a, m in zip(trajs[1].token_advantages, trajs[1].loss_mask) if m] == \
        pytest.approx([-0.1] * 4 + [0.0] * 3)
    assert {"critic/values_mean", "critic/vf_explained_var"} <= set(metrics)
    assign_with_critic("gae", trajs, values)  # whitened by default: still zero off the generated tokens
    assert all(a == 0.0 for t in trajs for a, m in zip(t.token_advantages, t.loss_mask) if not m)


def test_embedded_trainer_accepts_gae_only_with_the_append_context():
    def check(alg: AlgorithmConfig, roll: SamplingConfig) -> None:
        check_supported(alg, roll, OptimConfig(), RewardConfig())

    for critic in ("auto", "value_head"):  # auto is the embedded backend's own: the value head
        check(AlgorithmConfig(advantage="gae", critic=CriticConfig(type=critic)), SamplingConfig())
    def inputs(advantage: str) -> set[str]:
        return set(build_providers(ProviderContext(AlgorithmConfig(advantage=advantage))).by_input)
    assert inputs("gae") == {"values", "response_mask", "token_rewards"} and inputs("grpo") == set()
    with pytest.raises(ConfigError, match="with rollout.context=step: .*; use rollout.context=append"):
        check(AlgorithmConfig(advantage="gae"), SamplingConfig(context="step"))
    with pytest.raises(ConfigError, match="algorithm.critic.type=model is not supported on the embedded backend"):
        check(AlgorithmConfig(advantage="gae", critic=CriticConfig(type="model")), SamplingConfig())


@pytest.fixture(scope="module")
def base_policy(tiny_model_dir, calculator_tools):
    return load_policy(ModelConfig(path=str(tiny_model_dir), device="cpu"), calculator_tools, log=lambda *_: None)


def real_traj(policy, reward: float) -> Trajectory:
    traj = two_turn_traj(reward, ids_from=100 + int(reward * 7))
    b_ids = torch.tensor([traj.token_ids])
    with torch.no_grad():
        lps = policy.sequence_logprobs(b_ids, torch.ones_like(b_ids))[0].tolist()
    traj.logprobs = [lp * m for lp, m in zip(lps, traj.loss_mask)]
    return traj


def test_value_head_gives_one_value_per_token_shifted_by_one(base_policy):
    head = build_value_head(CriticConfig(), base_policy.model)
    torch.nn.init.normal_(head.linear.weight)
    ids = torch.tensor([[1, 2, 3, 4, 5], [6, 7, 8, 0, 0]])
    mask = torch.tensor([[1] * 5, [1, 1, 1, 0, 0]])
    with torch.no_grad():
        logprobs, hidden = base_policy.logprobs_and_hidden(ids, mask)
        values = head(hidden)
        assert logprobs.shape == values.shape == (2, 5)
        assert hidden.shape == (2, 5, base_policy.model.config.hidden_size)
        assert torch.all(values[:, 0] == 0)
        # the same products through a matmul of another shape: float32's summation order may differ (~1e-7), a
        # wrong shift by whole values
        assert torch.allclose(values[:, 1:], head.linear(hidden[:, :-1]).squeeze(-1), atol=1e-5)
    assert isinstance(head, ValueHead)


def test_value_loss_decreases_over_updates_on_a_fixed_batch(base_policy):
    policy = copy.copy(base_policy)
    policy.model = copy.deepcopy(base_policy.model)
    alg = AlgorithmConfig(advantage="gae", critic=CriticConfig(lr=1e-2, cliprange_value=10.0))
    head = build_value_head(alg.critic, policy.model)
    optimizer = torch.optim.AdamW([{"params": list(policy.model.parameters()), "lr": 0.0},
                                   {"params": list(head.parameters()), "lr": alg.critic.lr}])
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    trajs = [real_traj(policy, 1.0), real_traj(policy, 0.0), real_traj(policy, 1.0)]
    losses = []
    for step in range(6):
        metrics = assign_with_critic("gae", trajs, compute_values(policy, head, trajs, 8), gamma=1.0, lam=1.0)
        out = update_policy(policy, optimizer, scheduler, trajs, alg, OptimConfig(), seed=step,
                            terms=[ValueLoss(head, alg.critic)])
        losses.append(out["critic/value_loss"])
        assert out["actor/trained_fraction"] == 1.0 and "critic/vf_explained_var" in metrics
    assert losses[-1] < 0.5 * losses[0], losses


def test_hidden_states_alone_match_the_policy_forward(tiny_model_dir):
    """compute_values reads the base model without the LM head: the same hidden state as the full forward."""
    from rl_factory.policy import ModelConfig, load_policy

    policy = load_policy(ModelConfig(path=str(tiny_model_dir), device="cpu"), tools=[])
    ids = torch.tensor([[5, 6, 7, 8], [9, 10, 11, 0]])
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]])
    _, full = policy.logprobs_and_hidden(ids, mask)
    assert torch.allclose(policy.hidden_states(ids, mask), full, atol=1e-6)
