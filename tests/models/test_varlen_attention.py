"""`attn_implementation="rl_factory_varlen"`: packed rows and padded batches give each sequence the
logits it gets alone (the CPU path; on CUDA the same boundaries feed torch's FlashAttention kernel)."""
import pytest
import torch
from transformers import AutoModelForCausalLM, Qwen3Config

import rl_factory.models.varlen_attention as varlen


def _model(impl: str) -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256)
    cfg._attn_implementation = impl
    return AutoModelForCausalLM.from_config(cfg, attn_implementation=impl).eval()


@pytest.fixture(scope="module")
def models():
    ref, ours = _model("sdpa"), _model(varlen.NAME)
    ours.load_state_dict(ref.state_dict())
    return ref, ours


def _alone(ref, seqs):
    with torch.no_grad():
        return [ref(input_ids=s[None]).logits[0] for s in seqs]


def test_packed_row_equals_each_sequence_alone(models):
    ref, ours = models
    seqs = [torch.randint(0, 97, (n,)) for n in (7, 1, 12, 5)]
    ids = torch.cat(seqs)[None]
    pos = torch.cat([torch.arange(len(s)) for s in seqs])[None]
    with torch.no_grad():
        packed = ours(input_ids=ids, position_ids=pos).logits[0]
    expected = torch.cat(_alone(ref, seqs))
    torch.testing.assert_close(packed, expected, rtol=1e-4, atol=1e-5)
    # the same row through sdpa with no position_ids attends across sequences: different logits
    with torch.no_grad():
        crossed = ref(input_ids=ids).logits[0]
    assert not torch.allclose(crossed[7:], expected[7:], atol=1e-3)


def test_padded_batch_equals_each_sequence_alone(models):
    ref, ours = models
    seqs = [torch.randint(0, 97, (n,)) for n in (9, 4, 6)]
    width = max(len(s) for s in seqs)
    ids = torch.zeros(len(seqs), width, dtype=torch.long)
    mask = torch.zeros(len(seqs), width, dtype=torch.long)
    for i, s in enumerate(seqs):  # left padding, as generation batches are padded
        ids[i, width - len(s):], mask[i, width - len(s):] = s, 1
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        out = ours(input_ids=ids, attention_mask=mask, position_ids=pos).logits
    for i, expected in enumerate(_alone(ref, seqs)):
        torch.testing.assert_close(out[i, width - len(seqs[i]):], expected, rtol=1e-4, atol=1e-5)


def test_gradients_flow_like_sdpa(models):
    ref, ours = models
    seqs = [torch.randint(0, 97, (n,)) for n in (6, 8)]
    ids, pos = torch.cat(seqs)[None], torch.cat([torch.arange(len(s)) for s in seqs])[None]
    ours.zero_grad(), ref.zero_grad()
    ours(input_ids=ids, position_ids=pos).logits.logsumexp(-1).sum().backward()
    sum(ref(input_ids=s[None]).logits.logsumexp(-1).sum() for s in seqs).backward()
    for (name, a), (_, b) in zip(ours.named_parameters(), ref.named_parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-3, atol=1e-5, msg=name)


def test_boundaries_from_position_ids():
    pos = torch.tensor([[0, 1, 2, 0, 0, 1, 0, 1, 2, 3]])
    indices, cu, max_len = varlen.boundaries(pos, None, 1, 10, torch.device("cpu"))
    assert indices is None and cu.tolist() == [0, 3, 4, 6, 10] and max_len == 4


def test_kernel_computes_in_half_precision_only():
    """FlashAttention's varlen kernel takes fp16/bf16: fp32 inputs (an fp32 model, or RoPE under autocast) are
    cast first, which the long-context warm start on the H200 needed ("FlashAttention only support fp16 and bf16")."""
    from rl_factory.models.varlen_attention import kernel_dtype

    assert kernel_dtype(torch.bfloat16) is torch.bfloat16 and kernel_dtype(torch.float16) is torch.float16
    assert kernel_dtype(torch.float32) is torch.bfloat16
