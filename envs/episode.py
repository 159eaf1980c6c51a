"""Episodes: one trajectory's own view of the tools, opened when it starts and closed when it ends.

    episode = await env.open_episode(sample)      # or: async with env.episode(sample) as episode
    results = await episode.call_batch(calls)     # what the rollout calls
    await tools.call(...)                         # a reward's `tools` handle calls the same episode
    await episode.close()                         # servers stopped, ${episode.dir} removed

`scope: shared` servers are reached through the episode unchanged (the run's one connection); each
`scope: episode` server gets an instance of its own for the episode (envs.episode_servers). Tools a
manifest fills from the sample (`hidden_arguments`) are filled here, with this episode's sample. The
environment hook (`env.environment`, envs.environment), if any, is constructed per episode and closed
with it. An episode with only shared servers and no environment costs a small object: nothing starts.

A sample the episode cannot open for (a column the manifest names is missing, a per-episode server
that does not start, an environment whose constructor raises) raises `EpisodeError`, naming what
failed; everything already started for it is stopped first. Callers drop that sample's trajectory
and go on (rl_factory.rollout).

Closing is idempotent and never raises; the run-wide env closes whatever episodes are still open when
it stops (a cancelled rollout, Ctrl-C), so no per-episode process or directory outlives the run.
"""
from __future__ import annotations

import asyncio
import logging
import shutil
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, Protocol

from envs.episode_servers import EPISODE_DIR_PREFIX, EpisodeServer
from envs.mcp_client import ToolEnvError
from envs.templates import EpisodeVars, TemplateError, fill, needs_dir
from rl_factory.base.types import ToolCall, ToolResult

logger = logging.getLogger(__name__)


class EpisodeHost(Protocol):
    """What an episode uses of the run-wide env (`envs.tool_env.ToolEnv` is the one host). Named here as a
    protocol so that tool_env imports episode and episode imports nothing that imports it back."""

    environment: Any  # env.environment's factory, or None
    episode_stats: EpisodeStats
    _episodes: set[Episode]
    _episode_servers: list[EpisodeServer]
    _routes: dict[str, Any]

    @property
    def tools(self) -> list[dict[str, Any]]: ...
    @property
    def tool_names(self) -> list[str]: ...
    def server_of(self, tool_name: str) -> str | None: ...
    def _later(self, teardown: Any) -> None: ...
    async def _ensure_started(self) -> None: ...
    async def _call_batch(self, calls: Sequence[ToolCall], routes: dict | None, fills: dict | None
                          ) -> list[ToolResult]: ...
    async def _call_routed(self, call: ToolCall, routes: dict | None, fills: dict | None,
                           record: bool = True) -> ToolResult: ...


class EpisodeError(RuntimeError):
    """One sample's episode could not be opened, or its environment failed; the message says why."""


class Episode:
    """The handle a trajectory owns: `call_batch`, `call`, `tools`, `environment`, `state`, `close`."""

    def __init__(self, env: EpisodeHost, sample: dict, routes: dict, fills: dict[str, dict],
                 instances: list[tuple[EpisodeServer, Any]], workdir: str | None, environment: Any):
        self.env, self.sample = env, sample
        self.environment = environment  # the env.environment instance of this episode, or None
        self.workdir = workdir
        self._routes, self._fills, self._instances = routes, fills, instances
        self._closed = False

    @property
    def tools(self) -> list[dict[str, Any]]:
        """The model-visible schemas (the run's: every episode shows the same tools)."""
        return self.env.tools

    @property
    def tool_names(self) -> list[str]:
        return self.env.tool_names

    @property
    def state(self) -> dict[str, Any]:
        """What the environment kept (its `state` attribute), {} without one."""
        state = getattr(self.environment, "state", None)
        return state if isinstance(state, dict) else {}

    def server_of(self, tool_name: str) -> str | None:
        return self.env.server_of(tool_name)

    async def call_batch(self, calls: Sequence[ToolCall]) -> list[ToolResult]:
        """One turn's calls against this episode's servers (see `ToolEnv.call_batch`)."""
        return await self.env._call_batch(calls, self._routes, self._fills)

    async def call(self, call: ToolCall, record: bool = True) -> ToolResult:
        """One call against this episode's servers; `record=False` keeps it out of `tool/*` (rewards)."""
        return await self.env._call_routed(call, self._routes, self._fills, record)

    async def close(self, wait: bool = True) -> None:
        """Close the environment, stop this episode's servers and remove its directory; never raises.

        `wait=False` (what the rollout does) returns once the environment is closed and the episode's slots
        are free; its processes are stopped and its directory removed in the background, when no episode
        is open any more (`ToolEnv._later`; the run-wide env finishes them when it stops), so a trajectory
        does not wait for a process to exit and a batch's exits do not slow its last trajectories.
        """
        if self._closed:
            return
        self._closed = True
        t0 = time.perf_counter()
        try:
            if self.environment is not None:
                try:
                    await self.environment.close()
                except Exception as exc:  # noqa: BLE001 - user code: its failure must not leak processes
                    logger.warning("environment close() failed: %s: %s", type(exc).__name__, exc)
        finally:
            for server, _ in self._instances:
                server.free()
            self.env._episodes.discard(self)  # before _later: the last one to close starts the teardowns
            if wait:
                await self._teardown()
            else:
                self.env._later(self._teardown())
            self.env.episode_stats.closed(time.perf_counter() - t0)

    async def _teardown(self) -> None:
        try:
            await asyncio.gather(*(server.discard(conn) for server, conn in self._instances), return_exceptions=True)
        finally:
            if self.workdir is not None:
                shutil.rmtree(self.workdir, ignore_errors=True)

    async def __aenter__(self) -> Episode:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()


async def open_episode(env: EpisodeHost, sample: dict) -> Episode:
    """Open `sample`'s episode on a started env (see the module docstring).

    Raises:
        EpisodeError: this sample's episode cannot open; nothing of it is left running.
    """
    await env._ensure_started()
    t0 = time.perf_counter()
    servers = env._episode_servers
    routes = env._routes
    wants_dir = any(needs_dir(s.spec) for s in servers) or any(needs_dir(r.hidden) for r in routes.values())
    workdir = tempfile.mkdtemp(prefix=EPISODE_DIR_PREFIX) if wants_dir else None
    episode_vars = EpisodeVars(uuid.uuid4().hex[:12], workdir)
    instances: list[tuple[EpisodeServer, Any]] = []
    try:
        fills = {name: fill(r.hidden, sample, episode_vars, f"mcpServers.{r.source.name}.hidden_arguments."
                                                            f"{r.tool.name}")
                 for name, r in routes.items() if r.hidden}
        instances = await _acquire(servers, sample, episode_vars)
        if instances:
            own = {s.name: conn for s, conn in instances}
            routes = {name: replace(r, source=own[r.source.name]) if r.episodic else r for name, r in routes.items()}
        environment = env.environment() if env.environment is not None else None
    except BaseException as exc:
        await _release(instances)
        if workdir is not None:
            shutil.rmtree(workdir, ignore_errors=True)
        if isinstance(exc, TemplateError | ToolEnvError):
            env.episode_stats.failed()
            raise EpisodeError(str(exc)) from None
        if isinstance(exc, Exception):  # the environment's constructor: user code
            env.episode_stats.failed()
            raise EpisodeError(f"env.environment {env.environment.spec}(): {type(exc).__name__}: {exc}") from exc
        raise
    episode = Episode(env, sample, routes, fills, instances, workdir, environment)
    env._episodes.add(episode)
    env.episode_stats.opened(time.perf_counter() - t0)
    return episode


async def _acquire(servers: list[EpisodeServer], sample: dict, episode_vars: EpisodeVars
                   ) -> list[tuple[EpisodeServer, Any]]:
    """Every episode server's instance, started concurrently; on any failure (or cancel) none is kept."""
    if not servers:
        return []
    tasks = [asyncio.ensure_future(s.acquire(sample, episode_vars)) for s in servers]
    try:
        await asyncio.wait(tasks)
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await _release([(s, t.result()) for s, t in zip(servers, tasks) if t.done() and not t.cancelled()
                        and t.exception() is None])
        raise
    got = [(s, t.result()) for s, t in zip(servers, tasks) if t.exception() is None]
    errors = [t.exception() for t in tasks if t.exception() is not None]
    if errors:
        await _release(got)
        raise errors[0]
    return got


async def _release(instances: list[tuple[EpisodeServer, Any]]) -> None:
    await asyncio.gather(*(server.release(conn) for server, conn in instances), return_exceptions=True)


class EpisodeStats:
    """`episode/*` metrics of the run-wide env (reset with the tool metrics at each step)."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.counts: Counter[str] = Counter()
        self.open_s: list[float] = []
        self.close_s: list[float] = []

    def opened(self, seconds: float) -> None:
        self.counts["episode/opened"] += 1
        self.open_s.append(seconds)

    def failed(self) -> None:
        self.counts["episode/failed"] += 1

    def closed(self, seconds: float) -> None:
        self.close_s.append(seconds)

    def metrics(self, pool_hits: int) -> dict[str, float]:
        out = {k: float(v) for k, v in self.counts.items()}
        if self.open_s:
            out["episode/open_s/mean"] = sum(self.open_s) / len(self.open_s)
            out["episode/open_s/max"] = max(self.open_s)
        if self.close_s:
            out["episode/close_s/mean"] = sum(self.close_s) / len(self.close_s)
        if pool_hits:
            out["episode/pool_hits"] = float(pool_hits)
        return out
