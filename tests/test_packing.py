"""Shared-prefix packing of the update (rl_factory/packing.py) against plain rows, on the real tiny model.

A packed row must give every sample the log-probs, hidden states and gradient its own row gives; the
packing itself must lose no sample and follow its cost rule.
"""
import copy
from types import SimpleNamespace

import pytest
import torch

from rl_factory.packing import MIN_SHARED_PREFIX, Pack, attention_cost_ratio, build_packs, pack_inputs, shared_prefix_len
from rl_factory.policy import ModelConfig, load_policy
from rl_factory.types import Trajectory
from rl_factory.update import AlgorithmConfig, OptimConfig, collate, update_policy


@pytest.fixture(scope="module")
def base_policy(tiny_model_dir, calculator_tools):
    return load_policy(ModelConfig(path=str(tiny_model_dir), device="cpu"), calculator_tools, log=lambda *_: None)


def fresh(policy):
    out = copy.copy(policy)
    out.model = copy.deepcopy(policy.model)
    out._can_pack = None
    return out


def sample(ids):
    return SimpleNamespace(token_ids=list(ids))


def group_of(policy, question: str, answers: list[str], index: int, advantages: list[float]) -> list[Trajectory]:
    """A prompt's rollouts: the chat-templated question, then each answer (loss on the answer only)."""
    tok = policy.tokenizer
    prompt = tok.encode(tok.apply_chat_template([{"role": "user", "content": question}], tokenize=False,
                                                add_generation_prompt=True), add_special_tokens=False)
    out = []
    for answer, adv in zip(answers, advantages):
        gen = tok.encode(answer, add_special_tokens=False) + [tok.eos_token_id]
        ids = prompt + gen
        out.append(Trajectory(sample_index=index, prompt_ids=prompt, token_ids=ids,
                              loss_mask=[0] * len(prompt) + [1] * len(gen), logprobs=[0.0] * len(ids), messages=[],
                              turns=[], stop_reason="answer", advantage=adv))
    return out


def plain_logprobs(policy, samples):
    b = collate(samples, policy.tokenizer.pad_token_id, policy.device)
    return policy.sequence_logprobs(b["input_ids"], b["attention_mask"]), b


def test_shared_prefix_len():
    assert shared_prefix_len([[1, 2, 3, 4], [1, 2, 5], [1, 2, 3]]) == 2
    assert shared_prefix_len([[1, 2, 3], [1, 2, 3, 4]]) == 3  # one sequence is a prefix of the other
    assert shared_prefix_len([[7, 1], [8, 1]]) == 0
    assert shared_prefix_len([[4, 5, 6]]) == 3


def test_build_packs_groups_by_key_and_loses_nothing():
    prefix = list(range(100, 100 + 20))
    a = [sample(prefix + [k] * n) for k, n in ((3, 2), (1, 5), (2, 9))]
    b = [sample(prefix[:3] + [k] * n) for k, n in ((1, 4), (2, 6))]  # shares 3 tokens only: rows of their own
    solo = [sample(prefix + [3] * 7)]
    packs = build_packs(a + b + solo, ["a"] * 3 + ["b"] * 2 + ["c"], ratio=0.0)
    assert [len(p.samples) for p in packs] == [3, 1, 1, 1]
    assert [s.token_ids[20] for s in packs[0].samples] == [1, 2, 3]  # sorted by ids: neighbours share most
    assert packs[0].shared == [0, 20, 20] and packs[0].width == 20 + 5 + 9 + 2
    assert all(p.shared == [0] and p.width == len(p.samples[0].token_ids) for p in packs[1:])  # plain rows
    assert sorted(id(s) for p in packs for s in p.samples) == sorted(id(s) for s in a + b + solo)
    assert MIN_SHARED_PREFIX > 3


def test_build_packs_shares_the_whole_tree_not_only_the_prompt():
    """Rollouts that made the same tool call share it (and its result) too: each sample adds only what it
    does not share with its sorted neighbour."""
    prompt, call = list(range(10, 40)), [7] * 12
    group = [sample(prompt + call + [1, 1]), sample(prompt + [9] * 10), sample(prompt + call + [2, 2, 2])]
    (pack,) = build_packs(group, [0, 0, 0], ratio=0.0)
    assert [s.token_ids[30] for s in pack.samples] == [7, 7, 9]
    assert pack.shared == [0, 42, 30]
    assert pack.width == 44 + 3 + 10  # 30 + 12 shared once, then 2, 3 and 10 own tokens


def test_build_packs_stops_where_attention_would_cost_more_than_a_copy_of_the_prefix():
    prefix = list(range(10, 10 + 16))
    group = [sample(prefix + [k] * 300) for k in range(6)]
    # Long continuations behind a short prefix: with the tiny model's cost ratio a pack of two already costs
    # more attention than the 16 tokens it saves, so each sample keeps a row.
    packs = build_packs(group, [0] * 6, ratio=1.2e-3)
    assert [len(p.samples) for p in packs] == [1] * 6
    # Without attention cost everything shares one row, unless the token budget says otherwise.
    assert [len(p.samples) for p in build_packs(group, [0] * 6, ratio=0.0)] == [6]
    capped = build_packs(group, [0] * 6, ratio=0.0, max_width=16 + 2 * 300)
    assert [len(p.samples) for p in capped] == [2, 2, 2] and max(p.width for p in capped) <= 616


def test_attention_cost_ratio_of_the_tiny_model(base_policy):
    model = base_policy.model
    ratio = attention_cost_ratio(model.config, sum(p.numel() for p in model.parameters()))
    assert 1e-3 < ratio < 1.5e-3  # 4 heads x 32 dims x 4 layers against ~0.87M parameters
    assert attention_cost_ratio(SimpleNamespace(hidden_size=8), 100) == 0.0  # a config it cannot read


def test_pack_inputs_mask_lets_a_token_see_its_own_ancestors_only():
    # A and B share 4 tokens, C shares 3 with B: the row is A's 5 tokens, B's last one, C's last one
    pack = Pack([sample([5, 6, 7, 1, 2]), sample([5, 6, 7, 1, 9]), sample([5, 6, 7, 3])], shared=[0, 4, 3])
    t = pack_inputs([pack, Pack([sample([9, 9])], shared=[0])], pad_id=0, device=torch.device("cpu"),
                    mask_kind="bool")
    assert t["input_ids"].tolist() == [[5, 6, 7, 1, 2, 9, 3], [9, 9, 0, 0, 0, 0, 0]]
    assert t["position_ids"].tolist() == [[0, 1, 2, 3, 4, 4, 3], [0, 1, 0, 0, 0, 0, 0]]
    mask = t["attention_mask"][0, 0].int().tolist()
    assert mask[4] == [1, 1, 1, 1, 1, 0, 0]  # A's last token
    assert mask[5] == [1, 1, 1, 1, 0, 1, 0]  # B's last token: the shared four and itself, not A's
    assert mask[6] == [1, 1, 1, 0, 0, 0, 1]  # C's: the shared three and itself
    assert mask[1] == [1, 1, 0, 0, 0, 0, 0]
    pad = t["attention_mask"][1, 0].int().tolist()
    assert pad[3] == [0, 0, 0, 1, 0, 0, 0] and pad[1] == [1, 1, 0, 0, 0, 0, 0]  # padding sees itself only
    assert t["index"].tolist() == [[0, 1, 2, 3, 4], [0, 1, 2, 3, 5], [0, 1, 2, 6, 0], [7, 8, 7, 7, 7]]
    additive = pack_inputs([pack], 0, torch.device("cpu"), "additive")["attention_mask"]
    assert additive.dtype == torch.float32 and additive[0, 0, 5, 4] == torch.finfo(torch.float32).min
    assert additive[0, 0, 5, 3] == 0


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_packed_logprobs_and_hidden_states_equal_plain_rows(base_policy, attention):
    policy = fresh(base_policy)
    policy.model.config._attn_implementation = attention
    assert policy.can_pack()
    first = group_of(policy, "What is 347 * 29?", ["10063", "The answer is 10063.", "The answer is 1006"], 0,
                     [1.0, -1.0, 0.5])
    second = group_of(policy, "What is 2 + 2?", ["4", "four, I think"], 1, [1.0, -1.0])
    # a view that is a prefix of a trajectory (augmenters cut those): its tokens all lie in the shared part
    view = Trajectory(sample_index=0, prompt_ids=first[1].prompt_ids, token_ids=first[1].token_ids[:-3],
                      loss_mask=first[1].loss_mask[:-3], logprobs=[0.0] * (len(first[1].token_ids) - 3), messages=[],
                      turns=[], stop_reason="answer", advantage=1.0)
    samples = first + [view] + second
    packs = build_packs(samples, [0, 0, 0, 0, 1, 1], ratio=0.0)
    assert [len(p.samples) for p in packs] == [4, 2]
    assert max(packs[0].shared) > len(first[0].prompt_ids)  # the view shares its trajectory, past the prompt
    order = [s for p in packs for s in p.samples]
    packed = pack_inputs(packs, policy.tokenizer.pad_token_id, policy.device, "bool" if attention == "sdpa" else "additive")
    with torch.no_grad():
        plain, b = plain_logprobs(policy, order)
        logprobs, hidden = policy.packed_logprobs(packed, b["input_ids"], hidden=True)
        _, plain_hidden = policy.logprobs_and_hidden(b["input_ids"], b["attention_mask"])
    real = b["attention_mask"].bool()
    assert packed["input_ids"].numel() < real.sum()  # the shared prompts were computed once
    torch.testing.assert_close(logprobs[real], plain[real], atol=2e-5, rtol=0)
    torch.testing.assert_close(hidden[real], plain_hidden[real], atol=2e-5, rtol=1e-5)


def test_packed_update_gives_the_plain_update(base_policy):
    """The same SGD step with and without packing: the prefix's gradient is the sum over its continuations."""
    def step(shared: bool):
        policy = fresh(base_policy)
        group = group_of(policy, "What is 347 * 29?", ["10063", "The answer is 10063.", "no"], 0, [1.0, 0.5, -1.5])
        other = group_of(policy, "What is 12 * 12?", ["144", "It is 144."], 1, [1.0, -1.0])
        optimizer = torch.optim.SGD(policy.model.parameters(), lr=0.5)
        metrics = update_policy(policy, optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0),
                                group + other, AlgorithmConfig(), OptimConfig(grad_clip=1e9, shared_prefix=shared))
        return policy, metrics

    packed, packed_metrics = step(True)
    plain, plain_metrics = step(False)
    assert packed_metrics["actor/forward_tokens"] < plain_metrics["actor/forward_tokens"]
    moved = False
    for p, q, o in zip(packed.model.parameters(), plain.model.parameters(), base_policy.model.parameters()):
        torch.testing.assert_close(p, q, atol=1e-6, rtol=1e-5)
        moved |= not torch.equal(p, o)
    assert moved
    assert packed_metrics["actor/loss"] == pytest.approx(plain_metrics["actor/loss"], abs=1e-5)


def test_a_model_that_cannot_take_the_packed_mask_trains_on_plain_rows(base_policy):
    policy = fresh(base_policy)
    policy.model.config._attn_implementation = "flash_attention_2"  # takes no 4-D mask
    assert not policy.can_pack()
    group = group_of(policy, "What is 347 * 29?", ["10063", "ok"], 0, [1.0, -1.0])
    policy.model.config._attn_implementation = "sdpa"  # the forward itself must run here (no flash-attn)
    optimizer = torch.optim.SGD(policy.model.parameters(), lr=0.1)
    metrics = update_policy(policy, optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0), group,
                            AlgorithmConfig(), OptimConfig())
    # the cached verdict stands: plain rows, every token of both samples computed (padded to the longer)
    assert metrics["actor/forward_tokens"] == 2 * max(len(t.token_ids) for t in group)


def test_sliding_window_layers_are_not_packed(base_policy):
    """A 4-D mask would replace the sliding layers' own masks: such a model trains on plain rows."""
    policy = fresh(base_policy)
    policy.model.config = copy.deepcopy(policy.model.config)
    policy.model.config.sliding_window = 16
    policy.model.config.layer_types = ["sliding_attention", "full_attention"] * 2
    assert not policy.can_pack()
