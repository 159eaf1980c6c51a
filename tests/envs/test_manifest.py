"""Manifest loading: the shapes we accept and the errors that name the bad key."""
import json
import os
import sys

import pytest

from envs.manifest import PROJECT_ROOT, ManifestError, load_manifest


@pytest.fixture
def error_of(tmp_path, write_manifest):
    """error_of(servers) -> the ManifestError message for a manifest with these servers."""
    def load_error(servers) -> str:
        with pytest.raises(ManifestError) as info:
            load_manifest(write_manifest(tmp_path, servers))
        return str(info.value)
    return load_error


def test_shipped_calculator_manifest(calculator_manifest):
    spec = load_manifest(calculator_manifest).servers["calculator"]
    assert spec.transport == "stdio"
    assert spec.command == sys.executable  # "python" means our interpreter
    assert spec.args == ["-m", "envs.servers.calculator"]
    assert (spec.timeout_s, spec.max_concurrency) == (10, 64)


def test_unknown_key_is_named_with_file_and_hint(tmp_path, error_of):
    message = error_of({"calc": {"comand": "python"}})
    assert message == (f"{tmp_path / 'tools.yaml'}: mcpServers.calc: unknown key 'comand' "
                       "(did you mean 'command'?)")


def test_unknown_nested_and_top_level_keys(tmp_path, error_of):
    assert "mcpServers.calc.tools: unknown key 'inclde'" in error_of(
        {"calc": {"command": "python", "tools": {"inclde": ["x"]}}})
    path = tmp_path / "top.yaml"
    path.write_text("mcpServer: {}\n")
    with pytest.raises(ManifestError, match="unknown key 'mcpServer' \\(did you mean 'mcpServers'"):
        load_manifest(path)


def test_needs_command_or_url(tmp_path, error_of):
    assert error_of({"calc": {"args": []}}).endswith(
        "mcpServers.calc: needs either 'command' (stdio) or 'url' (HTTP/SSE), got neither")
    assert "got both" in error_of({"calc": {"command": "x", "url": "http://h"}})


def test_knob_and_transport_errors(tmp_path, error_of):
    assert "mcpServers.c.timeout_s: Input should be greater than 0" in error_of(
        {"c": {"command": "x", "timeout_s": 0}})
    assert "mcpServers.c: transport 'sse' needs 'url'" in error_of(
        {"c": {"command": "x", "transport": "sse"}})
    assert "'headers' only applies to HTTP/SSE servers" in error_of(
        {"c": {"command": "x", "headers": {"a": "b"}}})
    assert "mcpServers.c.args[1]" in error_of({"c": {"command": "x", "args": ["a", {}]}})


def test_missing_file_and_bad_syntax(tmp_path):
    with pytest.raises(ManifestError, match=r"^tool manifest not found: .*nope.yaml \(looked at /.*/nope.yaml\)$"):
        load_manifest(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("mcpServers: {calc: [\n")
    with pytest.raises(ManifestError, match="bad.yaml: not valid YAML"):
        load_manifest(bad)


def test_yaml_aliases_cannot_blow_a_small_file_up(tmp_path):
    # nine aliases of nine aliases ...: 376 bytes that expand to 9^7 (4.8 million) strings; it took minutes
    lines = ["anchors:", "  a: &a [" + ", ".join(["lol"] * 9) + "]"]
    lines += [f"  {c}: &{c} [" + ", ".join([f"*{p}"] * 9) + "]" for p, c in zip("abcdef", "bcdefg")]
    lines += ["mcpServers:", "  calc:", "    command: python", "    args: *g"]
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("\n".join(lines) + "\n")
    with pytest.raises(ManifestError, match=r"bomb.yaml: more than 200000 values once its YAML aliases"):
        load_manifest(bomb)
    loop = tmp_path / "loop.yaml"
    loop.write_text("mcpServers: &m\n  calc: {command: python, args: []}\n  again: *m\n")
    with pytest.raises(ManifestError, match=r"loop.yaml: a YAML alias refers to a value that contains it"):
        load_manifest(loop)
    shared = tmp_path / "shared.yaml"  # a few aliases, as people use them: fine
    shared.write_text("mcpServers:\n  a: &calc {command: python, args: [-m, envs.servers.calculator]}\n  b: *calc\n")
    assert list(load_manifest(shared).servers) == ["a", "b"]


def test_env_interpolation(tmp_path, monkeypatch, error_of, write_manifest):
    monkeypatch.setenv("RLF_TOKEN", "s3cret")
    monkeypatch.delenv("RLF_UNSET", raising=False)
    servers = {"web": {"url": "http://h/${RLF_TOKEN}/mcp",
                       "headers": {"Authorization": "Bearer ${oc.env:RLF_TOKEN}",
                                   "X-A": "${RLF_UNSET:-dflt}", "X-B": "${oc.env:RLF_UNSET,d2}"}}}
    spec = load_manifest(write_manifest(tmp_path, servers)).servers["web"]
    assert spec.url == "http://h/s3cret/mcp"
    assert spec.headers == {"Authorization": "Bearer s3cret", "X-A": "dflt", "X-B": "d2"}
    message = error_of({"web": {"url": "http://h", "headers": {"K": "${RLF_UNSET}"}}})
    assert message.endswith("mcpServers.web.headers.K: environment variable 'RLF_UNSET' is not set")


def test_stdio_child_gets_project_root_on_pythonpath(tmp_path, monkeypatch, write_manifest):
    monkeypatch.setenv("PYTHONPATH", "/inherited")
    servers = {"calc": {"command": "python", "args": ["-m", "m"], "cwd": "rel/dir",
                        "env": {"PYTHONPATH": "/mine", "PORT": 8000}}}
    spec = load_manifest(write_manifest(tmp_path, servers)).servers["calc"]
    assert spec.env["PYTHONPATH"].split(os.pathsep)[:2] == ["/mine", str(PROJECT_ROOT)]
    assert spec.env["PYTHONPATH"].endswith("/inherited")
    assert spec.env["PORT"] == "8000"  # YAML numbers become the strings a process expects
    assert spec.cwd == "rel/dir" and spec.args == ["-m", "m"]  # relative paths left alone


def test_json_http_sse_filters_and_empty(tmp_path, write_manifest):
    path = tmp_path / "mcp.json"
    path.write_text(json.dumps({"mcpServers": {
        "web": {"url": "http://h/mcp", "tools": {"include": ["search"]}},
        "old": {"url": "http://h/sse", "type": "sse", "tools": {"exclude": ["x"]}},
        "off": {"command": "x", "disabled": True}}}))
    servers = load_manifest(path).servers
    assert list(servers) == ["web", "old"]
    assert servers["web"].transport == "streamable_http" and servers["old"].transport == "sse"
    assert servers["web"].tools.keeps("search") and not servers["web"].tools.keeps("fetch")
    assert not servers["old"].tools.keeps("x") and servers["old"].tools.keeps("y")
    assert load_manifest(write_manifest(tmp_path, {})).servers == {}
    assert load_manifest(None).servers == {}


def test_restart_cache_prefix_and_functions(tmp_path, write_manifest):
    path = write_manifest(tmp_path, {
        "a": {"command": "x", "restart": "never", "cache": True, "prefix": True},
        "b": {"command": "x", "restart": {"max_restarts": 5, "backoff_s": 0.5}, "cache": {"ttl_s": 60, "tools": ["t"]},
              "prefix": "web"},
        "c": {"command": "x", "restart": "on_crash", "cache": False}})
    path.write_text(path.read_text() + "functions: [pkg.mod:fn, {function: tools.py:f, timeout_s: 2, cache: true}]\n")
    manifest = load_manifest(path)
    a, b, c = manifest.servers.values()
    assert (a.restart.max_restarts, b.restart.max_restarts, c.restart.max_restarts) == (0, 5, None)
    assert (b.restart.backoff_s, b.restart.max_backoff_s, c.restart.backoff_s) == (0.5, 30.0, 1.0)
    assert (a.cache.ttl_s, a.cache.max_entries, b.cache.tools, c.cache) == (300.0, 1024, ["t"], None)
    assert (a.tool_prefix("a"), b.tool_prefix("b"), c.tool_prefix("c")) == ("a__", "web__", "")
    assert [(f.function, f.timeout_s, f.cache is not None) for f in manifest.functions] == [
        ("pkg.mod:fn", 30.0, False), ("tools.py:f", 2.0, True)]
    assert manifest.base_dir == tmp_path


def test_new_knob_errors(error_of):
    assert error_of({"c": {"command": "x", "restart": "sometimes"}}).endswith(
        "mcpServers.c.restart: expected 'never', 'on_crash' or a mapping, got 'sometimes'")
    assert "mcpServers.c.restart: unknown key 'max_restart' (did you mean 'max_restarts'?)" in error_of(
        {"c": {"command": "x", "restart": {"max_restart": 1}}})
    assert "mcpServers.c.cache: unknown key 'ttl' (did you mean 'ttl_s'?)" in error_of(
        {"c": {"command": "x", "cache": {"ttl": 1}}})
    assert "mcpServers.c.prefix: expected true, false or a name" in error_of({"c": {"command": "x", "prefix": "a b"}})


def test_function_entry_errors(tmp_path):
    path = tmp_path / "tools.yaml"
    path.write_text("functions: [{function: m:f, timout_s: 1}]\n")
    with pytest.raises(ManifestError, match=r"functions\[0\]: unknown key 'timout_s' \(did you mean 'timeout_s'"):
        load_manifest(path)
