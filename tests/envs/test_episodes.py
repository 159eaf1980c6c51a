"""Episodes against real MCP servers: per-episode processes, sample templates, hidden arguments, the pool.

The server is tests/fakes/notes_server.py (state in its process's memory; `whoami` shows what the
manifest's `${sample.*}` / `${episode.*}` values became). Every check that a process or a directory is
gone reads /proc or the file system, not our own bookkeeping.
"""
import asyncio
import json
import os
import re
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from envs import ToolEnv
from envs.episode import EpisodeError
from envs.manifest import ManifestError, load_manifest
from rl_factory.types import ToolCall

pytestmark = pytest.mark.anyio
NOTES = str(Path(__file__).resolve().parents[1] / "fakes" / "notes_server.py")


def notes(*args, **knobs):
    return {"command": "python", "args": [NOTES, *args], **knobs}


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/status").read_text().split("State:")[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


async def call(handle, name, **arguments):
    return (await handle.call_batch([ToolCall(name, arguments)]))[0]


async def test_each_episode_gets_its_own_process_with_its_samples_values(tmp_path):
    manifest = {"mcpServers": {
        "notes": notes("--tag", "${sample.tag}", scope="episode",
                       env={"NOTES_ENV": "${episode.dir}/x-${sample.n}"}),
        "shared": notes("--tag", "run", prefix=True)}}
    async with ToolEnv.from_manifest(manifest, probe_sample={"tag": "probe", "n": 0}) as env:
        await env.list_tools()
        first, second = await asyncio.gather(env.open_episode({"tag": "a", "n": 1}),
                                             env.open_episode({"tag": "b", "n": 2}))
        me = [json.loads((await call(ep, "whoami")).text) for ep in (first, second)]
        assert [m["tag"] for m in me] == ["a", "b"] and me[0]["pid"] != me[1]["pid"]
        assert me[0]["env"] == f"{first.workdir}/x-1" and Path(first.workdir).is_dir()
        # state: one episode's note is not the other's; the shared server's note is everyone's
        assert (await call(first, "put", key="k", value="from a")).ok
        assert (await call(second, "get", key="k")).text == "(none)"
        assert (await call(first, "get", key="k")).text == "from a"
        assert (await call(first, "shared__put", key="k", value="run-wide")).ok
        assert (await call(second, "shared__get", key="k")).text == "run-wide"
        # the run-wide env reaches shared servers only
        outside = await call(env, "whoami")
        assert not outside.ok and "served per episode" in outside.text
        await first.close()
        await first.close()  # idempotent
        assert not alive(me[0]["pid"]) and not Path(first.workdir).exists()
        assert alive(me[1]["pid"])
        metrics = env.metrics()
        assert metrics["episode/opened"] == 2 and metrics["episode/open_s/max"] > 0
        # as the rollout closes them: the process is stopped once no episode is open any more
        third = await env.open_episode({"tag": "c", "n": 3})
        pid = json.loads((await call(third, "whoami")).text)["pid"]
        await third.close(wait=False)
        await asyncio.sleep(0.5)
        assert alive(pid) and Path(third.workdir).exists()  # `second` is still open: not yet
    # stopping the env closes the episode left open, and finishes the teardown it waited for
    assert not alive(me[1]["pid"]) and not Path(second.workdir).exists()
    assert not alive(pid) and not Path(third.workdir).exists()


async def test_hidden_arguments_are_filled_from_the_sample_and_hidden_from_the_model():
    manifest = {"mcpServers": {"notes": notes(hidden_arguments={"lookup": {"db_id": "${sample.db}"}})}}
    async with ToolEnv.from_manifest(manifest) as env:
        (schema,) = [s for s in await env.list_tools() if s["function"]["name"] == "lookup"]
        params = schema["function"]["parameters"]
        assert "db_id" not in params["properties"] and params["required"] == ["key"]
        async with env.episode({"db": "D7"}) as ep:
            assert (await call(ep, "lookup", key="k")).text == "D7:k"
            # the model cannot point the call at another sample's database
            assert (await call(ep, "lookup", key="k", db_id="D1")).text == "D7:k"
            missing = await call(ep, "lookup")
            assert not missing.ok and missing.error_kind == "bad_arguments" and "'key'" in missing.text
        outside = await call(env, "lookup", key="k")  # no sample here to fill it from
        assert not outside.ok and "call it through an episode" in outside.text
        with pytest.raises(EpisodeError, match=r"hidden_arguments.lookup.db_id names \$\{sample.db\}, but the "
                                               r"sample has no column 'db' \(its columns: other\)"):
            await env.open_episode({"other": 1})


async def test_a_hidden_argument_the_server_does_not_declare_fails_the_start():
    manifest = {"mcpServers": {"notes": notes(hidden_arguments={"lookup": {"database": "x"}})}}
    async with ToolEnv.from_manifest(manifest) as env:
        with pytest.raises(Exception, match=r"mcpServers.notes.hidden_arguments.lookup: tool 'lookup' declares no "
                                            r"argument 'database' \(its arguments: \['db_id', 'key'\]\)"):
            await env.list_tools()


async def test_one_samples_bad_server_fails_only_its_episode(tmp_path):
    manifest = {"mcpServers": {"notes": {"command": "python", "args": ["${sample.script}"], "scope": "episode",
                                         "startup_timeout_s": 20}}}
    async with ToolEnv.from_manifest(manifest, probe_sample={"script": NOTES}) as env:
        await env.list_tools()
        good, bad, lacking = await asyncio.gather(
            env.open_episode({"script": NOTES}), env.open_episode({"script": str(tmp_path / "missing.py")}),
            env.open_episode({"path": NOTES}), return_exceptions=True)
        assert isinstance(bad, EpisodeError) and "MCP server 'notes'" in str(bad) and "failed to start" in str(bad)
        assert isinstance(lacking, EpisodeError) and "has no column 'script'" in str(lacking)
        assert (await call(good, "put", key="a", value="1")).ok
        await good.close()
        assert env.metrics()["episode/failed"] == 2


async def test_max_concurrency_bounds_live_episodes_and_the_pool_hides_start_up():
    manifest = {"mcpServers": {"notes": notes(scope="episode", max_concurrency=1, pool=1)}}
    async with ToolEnv.from_manifest(manifest) as env:
        await env.list_tools()  # starts the probe (then stops it) and one pooled instance
        t0 = time.perf_counter()
        first = await env.open_episode({})
        took = time.perf_counter() - t0
        pid = json.loads((await call(first, "whoami")).text)["pid"]
        waiting = asyncio.ensure_future(env.open_episode({}))
        await asyncio.sleep(0.5)
        assert not waiting.done()  # the bound: one live episode at a time
        await first.close()
        second = await asyncio.wait_for(waiting, 30)
        other = json.loads((await call(second, "whoami")).text)["pid"]
        assert other != pid and not alive(pid)  # a fresh process: none is reused
        assert (await call(second, "get", key="k")).text == "(none)"
        await second.close()
        assert env.metrics()["episode/pool_hits"] >= 1
        assert took < 0.5  # a pooled process was ready (a start takes over a second here)


def test_manifest_refuses_episode_values_where_they_cannot_apply():
    cases = [
        ({"args": ["${sample.db}"]}, "args names ${sample.db}, which only a `scope: episode` server has"),
        ({"args": ["${sample.db}"], "scope": "episode", "pool": 2}, "pool starts processes before their episode"),
        ({"scope": "episode", "cache": True}, "cache does not apply to a scope: episode server"),
        ({"pool": 1}, "pool keeps started processes for per-episode servers: it needs scope: episode"),
        ({"scope": "episode", "env": {"X": "${episode.path}"}}, "unknown reference ${episode.path}"),
    ]
    for knobs, message in cases:
        with pytest.raises(ManifestError) as err:
            load_manifest({"mcpServers": {"s": notes(**knobs)}})
        assert message in str(err.value) and "mcpServers.s" in str(err.value)


def test_episode_values_are_not_environment_variables(monkeypatch):
    monkeypatch.setenv("sample", "no")  # ${sample.x} is not ${VAR} interpolation
    spec = load_manifest({"mcpServers": {"s": notes("${sample.x}", scope="episode")}}).servers["s"]
    assert spec.args[-1] == "${sample.x}" and os.environ["sample"] == "no"


# ---- sample values are data: they never steer the launch line ---------------------------------------------

def test_a_sample_value_cannot_change_a_urls_host(monkeypatch):
    from envs.templates import EpisodeVars, fill_launch

    monkeypatch.setenv("TENANT_KEY", "sk-tenant-secret-123")
    manifest = {"mcpServers": {"api": {"url": "http://${sample.tenant}.example.com/mcp/${sample.path}",
                                       "headers": {"Authorization": "Bearer ${TENANT_KEY}"}, "scope": "episode"}}}
    spec = load_manifest(manifest).servers["api"]
    ep = EpisodeVars("e1")
    good = fill_launch(spec, {"tenant": "acme", "path": "v1"}, ep, "mcpServers.api")
    assert good.url == "http://acme.example.com/mcp/v1"
    for tenant in ("127.0.0.1:9/steal?", "evil.com/", "user@evil.com#", "evil.com%2F"):
        url = fill_launch(spec, {"tenant": tenant, "path": "../../x?y#z"}, ep, "mcpServers.api").url
        parts = urlsplit(url)
        assert parts.hostname.endswith(".example.com") and parts.port is None and not parts.username, url
        assert parts.path.startswith("/mcp/") and parts.path.count("/") == 2 and not parts.query, url
    with pytest.raises(ValueError, match=r"headers.X-Tenant: the sample's value holds a line break"):
        bad = load_manifest({"mcpServers": {"api": {"url": "http://h/mcp", "scope": "episode",
                                                    "headers": {"X-Tenant": "${sample.t}"}}}}).servers["api"]
        fill_launch(bad, {"t": "a\r\nX-Admin: 1"}, ep, "mcpServers.api")


async def test_a_sample_value_starting_with_a_dash_is_not_an_option(tmp_path):
    stolen = tmp_path / "stolen.json"
    manifest = {"mcpServers": {"notes": notes("--tag", "t", "${sample.extra}", scope="episode")}}
    async with ToolEnv.from_manifest(manifest, probe_sample={"extra": "ok"}) as env:
        await env.list_tools()
        with pytest.raises(EpisodeError, match=r"args\[3\]: \$\{sample.extra\} gives '--file=.*which the server "
                                               r"would read as an option"):
            episode = await env.open_episode({"extra": f"--file={stolen}"})
            await call(episode, "put", key="k", value="v")  # old code: the server wrote the row's file
        assert not stolen.exists() and env.metrics()["episode/failed"] == 1


async def test_a_sample_value_cannot_climb_out_of_the_episode_directory(tmp_path):
    manifest = {"mcpServers": {"notes": notes(scope="episode", cwd="${episode.dir}/${sample.sub}",
                                              env={"NOTES_ENV": "x"}),
                               "files": notes("--file", "${episode.dir}/${sample.name}", scope="episode", prefix=True)}}
    async with ToolEnv.from_manifest(manifest, probe_sample={"sub": ".", "name": "n.json"}) as env:
        await env.list_tools()
        episode = await env.open_episode({"sub": ".", "name": "n.json"})
        assert json.loads((await call(episode, "whoami")).text)["cwd"] == os.path.realpath(episode.workdir)
        await episode.close()
        with pytest.raises(EpisodeError, match=r"notes.cwd: \$\{episode.dir\}/\$\{sample.sub\} gives .*outside "
                                               r"the episode's directory"):
            await env.open_episode({"sub": "../..", "name": "n.json"})
        with pytest.raises(EpisodeError, match=r"files.args\[2\]: .* outside the episode's directory"):
            await env.open_episode({"sub": ".", "name": f"../../{tmp_path.name}/x.json"})


async def test_files_gives_each_episode_its_own_copy_of_the_samples_file(tmp_path):
    # A server that writes the file it is given (as PyPI's mcp-server-sqlite does with --db-path): named
    # directly, every trajectory of the sample shares (and changes) the dataset's own file.
    notes_file = tmp_path / "row0.json"
    notes_file.write_text(json.dumps({"seed": "from the dataset"}))
    shared = {"mcpServers": {"notes": notes("--file", "${sample.notes}", scope="episode")}}
    async with ToolEnv.from_manifest(shared, probe_sample={"notes": str(notes_file)}) as env:
        a, b = await asyncio.gather(*(env.open_episode({"notes": str(notes_file)}) for _ in range(2)))
        await call(a, "put", key="k", value="from a")
        assert (await call(b, "get", key="k")).text == "from a"  # what files: is for
        await a.close(), await b.close()
    notes_file.write_text(json.dumps({"seed": "from the dataset"}))
    copied = {"mcpServers": {"notes": notes("--file", "${episode.dir}/state/notes.json", scope="episode",
                                            files={"state/notes.json": "${sample.notes}"})}}
    async with ToolEnv.from_manifest(copied, probe_sample={"notes": str(notes_file)}) as env:
        a, b = await asyncio.gather(*(env.open_episode({"notes": str(notes_file)}) for _ in range(2)))
        assert (await call(a, "put", key="k", value="from a")).ok
        assert (await call(b, "get", key="k")).text == "(none)"
        assert [(await call(ep, "get", key="seed")).text for ep in (a, b)] == ["from the dataset"] * 2
        assert json.loads((Path(a.workdir) / "state" / "notes.json").read_text())["k"] == "from a"
        with pytest.raises(EpisodeError, match=r"^mcpServers.notes.files.state/notes.json: \$\{sample.notes\} is "
                                               r"'.*missing.json', which does not exist$"):
            await env.open_episode({"notes": str(tmp_path / "missing.json")})
        await a.close(), await b.close()
    assert json.loads(notes_file.read_text()) == {"seed": "from the dataset"}  # the dataset's file is untouched


@pytest.mark.parametrize("entry, message", [
    (notes(files={"db": "x"}), "files are copied into each episode's ${episode.dir}: they need scope: episode"),
    (notes(scope="episode", pool=1, files={"db": "x"}), "pool starts processes before their episode exists"),
    (notes(scope="episode", files={"../db": "x"}), "expected a relative path inside ${episode.dir}"),
    (notes(scope="episode", files={"/db": "x"}), "expected a relative path inside ${episode.dir}"),
])
def test_files_are_checked_when_the_manifest_loads(entry, message):
    with pytest.raises(ManifestError, match=re.escape(message)):
        load_manifest({"mcpServers": {"s": entry}})
