"""A `scope: episode` server: one instance per episode, a bound on live ones, and a warm pool.

Each episode gets its own `MCPServerConnection`: its own process for a stdio server (state kept per
process: a knowledge graph, a shell), its own MCP session for a `url` server (state kept per session).
The instance is stopped when the episode closes and never reused, so no state kept in it crosses from
one trajectory to the next. State the server keeps outside it (a file it was handed) is shared, unless
`files` gives each episode its own copy in `${episode.dir}` (copied before the instance starts).

- Tools: the prompt renders one tool list for the whole run, so the server's tools are listed once,
  when the env starts, from a *probe* instance that is stopped right after. A launch line that names
  the sample (`${sample.db_path}`) is probed with the env's `probe_sample` (the first training row).
  Every episode's instance must serve those tools; one that does not fails its episode.
- `max_concurrency` bounds the live instances (= live episodes using this server): an episode past the
  bound waits for one to close. The same number still bounds each instance's in-flight calls.
- `pool: N` keeps N instances started ahead of their episodes, so an episode takes a ready one and
  does not wait for a process start. When an episode closes, a replacement is started in the
  background, at most POOL_STARTS at once (a quarter of the CPUs, at least one): a batch's worth of
  interpreters starting while the batch still runs would take the CPU from the rollout using the pool
  (benchmarks/episodes.py measures it); a batch's episodes end together, so its replacements start as
  it finishes, during scoring and the update. Only for a launch line that does not name the sample or
  episode (envs.templates refuses it otherwise). Pool instances are not episodes: they do not count
  against `max_concurrency`.
- A closing episode frees its slot at once (`free`); stopping its instance (`discard`) may finish later
  (envs.episode: a trajectory does not wait for a process to exit).
- Logs: every instance's stderr goes to `<log_dir>/<name>.log` (all instances append to one file), or to
  anonymous files until `log_to(dir)` moves them, as `ToolEnv.log_to` does for the run's servers.

Stopping the env stops every instance, pooled or live, and cancels the pool's pending starts.
"""
from __future__ import annotations

import asyncio
import logging
import os
import shutil
import tempfile
from typing import Any

from mcp.types import CallToolResult

from envs.manifest import ServerSpec
from envs.mcp_client import MCPServerConnection, ServerStartError, ToolCallError, ToolEnvError
from envs.templates import (EpisodeVars, TemplateError, copy_files, fill_launch, launch_refs, needs_dir,
                             refs)

logger = logging.getLogger(__name__)
EPISODE_DIR_PREFIX = "rlf-episode-"
POOL_STARTS = max(1, (os.cpu_count() or 1) // 4)


class EpisodeServer:
    """The run's handle on one `scope: episode` server (a ToolSource for routing; see the module docstring)."""

    def __init__(self, name: str, spec: ServerSpec, log_dir: Any = None, max_message_bytes: int = 16 << 20):
        self.name, self.spec, self.label = name, spec, f"'{name}'"
        self.log_dir, self.max_message_bytes = log_dir, max_message_bytes
        self.tools: list = []
        self.probe_sample: dict | None = None
        self.pool_hits = 0
        self._live: asyncio.Semaphore | None = None
        self._ready: list[MCPServerConnection] = []
        self._filling: set[asyncio.Task] = set()
        self._starts: asyncio.Semaphore | None = None  # bounds the pool's own starts (POOL_STARTS)
        self._instances: set[MCPServerConnection] = set()  # every started one, to stop at the end
        self._closed = False

    @property
    def sample_refs(self) -> list[str]:
        """The sample columns its launch line names."""
        return [ref for kind, ref in launch_refs(self.spec) if kind == "sample"]

    @property
    def _file_refs(self) -> list[str]:
        return [ref for kind, ref in refs(self.spec.files) if kind == "sample"]

    # ---- the run: probe, pool, stop -------------------------------------------------------------

    async def start(self) -> None:
        """List the tools from a probe instance, then fill the pool; raises ToolEnvError."""
        self._closed = False
        self._live = asyncio.Semaphore(self.spec.max_concurrency)
        self._starts = asyncio.Semaphore(POOL_STARTS)
        if (self.sample_refs or self._file_refs) and self.probe_sample is None:
            named = (self.sample_refs or self._file_refs)[0]
            raise ToolEnvError(f"mcpServers.{self.name}: its launch line names ${{sample.{named}}}, so listing its "
                               "tools means starting it for one sample, and none was given (the trainer and "
                               "main_eval.sh pass the first row; `python -m envs list` takes --sample JSON)")
        workdir = tempfile.mkdtemp(prefix=EPISODE_DIR_PREFIX) if needs_dir(self.spec) else None
        try:
            try:
                probe_vars = EpisodeVars("probe", workdir)
                spec = fill_launch(self.spec, self.probe_sample or {}, probe_vars, f"mcpServers.{self.name}")
                copy_files(self.spec, self.probe_sample or {}, probe_vars, f"mcpServers.{self.name}")
            except TemplateError as exc:
                raise ToolEnvError(f"listing the tools of a scope: episode server for the first sample: {exc}") from None
            probe = self._connection(spec)
            try:
                await probe.start()
                self.tools = probe.tools
            finally:
                await probe.stop()
        finally:
            if workdir is not None:
                shutil.rmtree(workdir, ignore_errors=True)
        await asyncio.gather(*(self._fill_one() for _ in range(self.spec.pool)))

    async def stop(self) -> None:
        """Stop every instance (pooled and live) and the pool's pending starts; safe to call twice."""
        self._closed = True
        for task in list(self._filling):
            task.cancel()
        await asyncio.gather(*self._filling, return_exceptions=True)
        instances, self._instances, self._ready = list(self._instances), set(), []
        await asyncio.gather(*(c.stop() for c in instances), return_exceptions=True)

    def log_to(self, directory: Any) -> None:
        """Keep the stderr of every instance, started (pooled, live) or to come, in `<directory>/<name>.log`
        from now on, after what each wrote so far (`MCPServerConnection.log_to`): like the run's shared
        servers, per-episode ones start with anonymous logs and move once the run may write."""
        self.log_dir = directory
        for conn in list(self._instances):
            conn.log_to(directory)

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> CallToolResult:
        # Routing sends an episode's calls to its own instance; this is the run-wide env being asked.
        raise ToolCallError("server_error", f"tool '{name}' is served per episode (mcpServers.{self.name} has "
                                            "scope: episode): call it through an episode, env.open_episode(sample)")

    # ---- episodes -------------------------------------------------------------------------------

    async def acquire(self, sample: dict, episode: EpisodeVars) -> MCPServerConnection:
        """This episode's own started instance (waits while `max_concurrency` episodes are live).

        Raises:
            TemplateError: the sample lacks a column the launch line names.
            ServerStartError: the instance did not start (or does not serve the run's tools).
        """
        if self._closed or self._live is None:
            raise ServerStartError(f"MCP server '{self.name}' is not running (the tool env was stopped)")
        spec = fill_launch(self.spec, sample, episode, f"mcpServers.{self.name}")  # before waiting for a slot
        if self.spec.files:
            await asyncio.to_thread(copy_files, self.spec, sample, episode, f"mcpServers.{self.name}")
        await self._live.acquire()
        conn = None
        try:
            if self._ready:
                conn = self._ready.pop()
                self.pool_hits += 1
            else:
                conn = self._connection(spec)
                await conn.start()
            self._check_tools(conn)
            return conn
        except BaseException:
            self._live.release()
            if conn is not None:
                await self.discard(conn)
            raise

    def free(self) -> None:
        """An episode using this server closed: another may start (its instance may still be exiting), and the
        pool gets a replacement started."""
        if self._live is not None:
            self._live.release()
        self._refill()

    async def release(self, conn: MCPServerConnection) -> None:
        """Free an episode's slot and stop its instance (its process exits)."""
        self.free()
        await self.discard(conn)

    # ---- helpers --------------------------------------------------------------------------------

    def _connection(self, spec: ServerSpec) -> MCPServerConnection:
        conn = MCPServerConnection(self.name, spec, self.log_dir, max_message_bytes=self.max_message_bytes)
        self._instances.add(conn)
        return conn

    async def discard(self, conn: MCPServerConnection) -> None:
        """Stop an instance for good (never back into the pool)."""
        self._instances.discard(conn)
        await conn.stop()

    def _check_tools(self, conn: MCPServerConnection) -> None:
        want, got = {t.name for t in self.tools}, {t.name for t in conn.tools}
        if not want <= got:
            raise ServerStartError(f"MCP server '{self.name}' started for this episode without the tools listed at "
                                   f"the start of the run: {sorted(want - got)} (the prompt shows every episode "
                                   "the same tools)")

    def _refill(self) -> None:
        if self._closed or len(self._ready) + len(self._filling) >= self.spec.pool:
            return
        task = asyncio.ensure_future(self._fill_one())
        self._filling.add(task)
        task.add_done_callback(self._filling.discard)

    async def _fill_one(self) -> None:
        conn = self._connection(self.spec)
        try:
            async with self._starts:
                await conn.start()
        except ServerStartError as exc:  # the next episode starts its own, and reports the failure
            logger.warning("warm pool of %r: an instance failed to start: %s", self.name, exc)
            await self.discard(conn)
            return
        except BaseException:
            await self.discard(conn)
            raise
        if self._closed:
            await self.discard(conn)
        else:
            self._ready.append(conn)
