"""The TTL result cache: canonical keys, expiry, LRU bound, only successes, coalesced calls,
and the cache knob of a manifest (functions and MCP servers) with its metrics."""
import asyncio

import pytest

from envs import ToolEnv, ToolEnvError
from envs.cache import ResultCache
from envs.manifest import CacheSpec
from rl_factory.types import ToolCall, ToolResult

pytestmark = pytest.mark.anyio

COUNTING_TOOLS = '''
import asyncio

CALLS = []


def square(x: int) -> int:
    """Square x (records each real call)."""
    CALLS.append(("square", x))
    if x < 0:
        raise ValueError("negative")
    return x * x


async def lookup(key: str, options: dict | None = None) -> str:
    """A slow deterministic lookup."""
    CALLS.append(("lookup", key))
    await asyncio.sleep(0.2)
    return key.upper()
'''


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def ok(text: str) -> ToolResult:
    return ToolResult(call=ToolCall("t", {}), text=text)


async def test_ttl_lru_and_canonical_keys():
    clock = Clock()
    cache = ResultCache(CacheSpec(ttl_s=10, max_entries=2), clock=clock)
    assert ResultCache.key("t", {"a": 1, "b": [1, 2]}) == ResultCache.key("t", {"b": [1, 2], "a": 1})
    assert ResultCache.key("t", {"a": 1}) != ResultCache.key("u", {"a": 1})

    async def compute(text):
        return ok(text)
    assert isinstance(await cache.run("k1", lambda: compute("one")), ToolResult)  # a miss
    assert await cache.run("k1", lambda: compute("other")) == "one"  # a hit: the stored text
    await cache.run("k2", lambda: compute("two"))
    cache.get("k1")  # k1 is now the most recently used
    await cache.run("k3", lambda: compute("three"))
    assert (cache.get("k1"), cache.get("k2"), cache.get("k3")) == ("one", None, "three")
    clock.now = 10.0
    assert cache.get("k1") is None and len(cache) == 1  # expired entries go on lookup


async def test_errors_are_not_cached_and_followers_share_the_leader():
    cache = ResultCache(CacheSpec())
    runs = []

    async def slow_ok():
        runs.append(1)
        await asyncio.sleep(0.1)
        return ok("v")
    outcomes = await asyncio.gather(*(cache.run("k", slow_ok) for _ in range(10)))
    assert len(runs) == 1 and outcomes.count("v") == 9  # one call, nine waited for it

    async def failing():
        runs.append(2)
        return ToolResult(call=ToolCall("t", {}), text="Error: x", error_kind="timeout")
    await cache.run("e", failing)
    await cache.run("e", failing)
    assert runs.count(2) == 2 and cache.get("e") is None


@pytest.fixture
def tools_file(tmp_path):
    path = tmp_path / "counting_tools.py"
    path.write_text(COUNTING_TOOLS)
    return path


async def test_function_cache_counts_hits(tmp_path, write_manifest, tools_file):
    manifest = tmp_path / "tools.yaml"
    manifest.write_text(f"functions:\n  - {{function: {tools_file.name}:square, cache: {{ttl_s: 60}}}}\n"
                        f"  - {{function: {tools_file.name}:lookup, cache: true}}\n")
    async with ToolEnv.from_manifest(manifest) as env:
        module = __import__("sys").modules[env._sources[0].fn.__module__]
        first, again, failed, failed_again = [await env.call(c) for c in [
            ToolCall("square", {"x": 3}), ToolCall("square", {"x": 3}),
            ToolCall("square", {"x": -1}), ToolCall("square", {"x": -1})]]
        assert (first.text, first.cached, again.text, again.cached) == ("9", False, "9", True)
        assert again.latency_s == 0.0 and failed_again.error_kind == "server_error"
        assert module.CALLS.count(("square", 3)) == 1 and module.CALLS.count(("square", -1)) == 2
        # n rollouts making the same call at once: one real call.
        same = await env.call_batch([ToolCall("lookup", {"key": "q", "options": {"b": 1, "a": 2}})] * 8)
        assert [r.text for r in same] == ["Q"] * 8 and module.CALLS.count(("lookup", "q")) == 1
        metrics = env.metrics()
    assert metrics["tool/square/cache_hits"] == 1 and metrics["tool/lookup/cache_hits"] == 7
    assert metrics["tool/cache_hits"] == 8 and metrics["tool/calls"] == 12


async def test_server_cache_only_for_listed_tools(tmp_path, write_manifest, slow_server):
    path = write_manifest(tmp_path, {"slow": slow_server(cache={"ttl_s": 60, "tools": ["sleep"]})})
    async with ToolEnv.from_manifest(path) as env:
        slept = [await env.call(ToolCall("sleep", {"seconds": 0.2})) for _ in range(2)]
        assert [r.cached for r in slept] == [False, True] and slept[0].latency_s >= 0.2
        pids = [await env.call(ToolCall("pid", {})) for _ in range(2)]
        assert [r.cached for r in pids] == [False, False]
        assert env.metrics()["tool/sleep/cache_hits"] == 1 and "tool/pid/cache_hits" not in env.metrics()
    bad = write_manifest(tmp_path, {"slow": slow_server(cache={"tools": ["nope"]})}, name="bad.yaml")
    with pytest.raises(ToolEnvError, match=r"'slow': cache.tools names \['nope'\]"):
        async with ToolEnv.from_manifest(bad) as env:
            await env.list_tools()
