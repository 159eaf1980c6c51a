"""LoopLocal: one value per running event loop (the scorer, the process executor and the judge client
keep their semaphores and httpx clients in one)."""
import asyncio

from rl_factory.base.loop_local import LoopLocal


def test_one_value_per_event_loop():
    made = []
    local = LoopLocal(lambda: made.append(asyncio.Semaphore(2)) or made[-1])

    async def twice():
        first, again = local.get(), local.get()
        async with first:  # usable in this loop
            pass
        return first, again

    first, again = asyncio.run(twice())
    assert first is again and len(made) == 1
    second, _ = asyncio.run(twice())  # a new loop: a new semaphore, not one bound to the closed loop
    assert second is not first and len(made) == 2

    async def close():
        return local.pop(), local.pop()

    assert asyncio.run(close()) == (None, None)  # made in another loop: nothing to close here
