"""A row's attention in the embedded engine does not depend on how wide the forward is.

The width of a forward is set by its longest row (rounded up to KV_BLOCK), so it changes with whatever
shares the batch; a row's result must not. These shapes are the engine's: a decode step (one query) and
a prefill after a kept cache (the observation's queries at positions past the cached turn), on one and
two torch threads.
"""
import pytest
import torch

from rl_factory.engines.kv import KV_BLOCK, attention_masks, ragged_attention

HEADS, KV_HEADS, DIM = 4, 2, 32


@pytest.fixture(params=[1, 2])
def threads(request):
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)


def attend(query, keys, values, positions, width):
    mask = attention_masks(positions, width)["full_attention"]
    out, _ = ragged_attention(None, query, keys[:, :, :width], values[:, :, :width], mask, scaling=DIM ** -0.5)
    return out


# (first query position, queries per row): decode steps, a first turn's prefill, and prefills after a kept
# cache; (77, 53) is a turn-2 prefill of the default job whose bits changed at width 256 when BLAS summed
# the whole width at once
SHAPES = [(65, 1), (300, 1), (0, 53), (77, 53), (128, 53), (155, 13), (222, 8), (286, 20), (244, 32)]


@pytest.mark.parametrize("start,queries", SHAPES)
def test_a_rows_attention_is_the_same_bits_at_every_width(threads, start, queries):
    gen = torch.Generator().manual_seed(start * 1000 + queries)
    rows, capacity = 3, 640
    query = torch.randn(rows, HEADS, queries, DIM, generator=gen)
    keys = torch.randn(rows, KV_HEADS, capacity, DIM, generator=gen)
    values = torch.randn(rows, KV_HEADS, capacity, DIM, generator=gen)
    positions = start + torch.arange(queries)[None].expand(rows, queries)
    narrowest = -(-(start + queries) // KV_BLOCK) * KV_BLOCK
    want = attend(query, keys, values, positions, narrowest)
    for width in range(narrowest + KV_BLOCK, capacity + 1, KV_BLOCK):
        got = attend(query, keys, values, positions, width)
        assert torch.equal(got, want), f"width {width} vs {narrowest}: {(got - want).abs().max().item():.3g}"


def test_slot_copies_and_saves_move_the_cached_positions_only():
    """`copy` (twin prompts, rows moving into freed slots) and `save` (a finished turn's cache) take a slot's
    cached positions, not its whole capacity (the rest is scratch every forward masks), and a saved cache
    loads back into any slot as it was."""
    from rl_factory.engines.kv import KVSlots

    slots = KVSlots(torch.device("cpu"), max_rows=6, full_positions=256)
    slots.reserve(6, 0)
    like = torch.zeros(6, KV_HEADS, 1, DIM)
    keys, values = slots._layer(0, like, 64)
    keys.copy_(torch.randn_like(keys))
    values.copy_(torch.randn_like(values))
    slots.lengths[:] = torch.tensor([5, 70, 3, 0, 0, 0])
    scratch = keys[3, :, 70:].clone()

    slots.copy([0, 1], [3, 4])
    assert slots.lengths.tolist() == [5, 70, 3, 5, 70, 0]
    assert torch.equal(keys[4, :, :70], keys[1, :, :70]) and torch.equal(values[3, :, :5], values[0, :, :5])
    assert torch.equal(keys[3, :, 70:], scratch)  # past what any source holds: not copied

    saved = slots.save([1, 2])
    assert [n for n, _, _ in saved] == [70, 3]
    assert torch.equal(saved[0][1][0], keys[1, :, :70]) and torch.equal(saved[1][2][0], values[2, :, :3])
    keys[1].zero_()  # the saved copies do not alias the slots
    assert not torch.equal(saved[0][1][0], keys[1, :, :70])
    assert slots.load(5, saved[0]) == 70
    assert torch.equal(keys[5, :, :70], saved[0][1][0]) and slots.lengths[5] == 70
