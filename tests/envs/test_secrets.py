"""Secrets from a manifest's env and headers never reach what we print: error messages, logs,
`python -m envs`, `repr(ServerSpec)`, tool error texts, or the run's config.yaml."""
import logging
import os
import subprocess
import sys

import pytest
import yaml

from envs import ToolEnv, ToolEnvError
from envs.manifest import describe_transport, load_manifest
from rl_factory.types import ToolCall

SECRET = "sk-live-4f9c2d81e7"
pytestmark = pytest.mark.anyio


@pytest.fixture(autouse=True)
def secret_env(monkeypatch):
    monkeypatch.setenv("RLF_TEST_API_KEY", SECRET)


@pytest.fixture
def leaky(tmp_path, write_manifest, fault_server):
    """A server given the secret three ways (env, an argument, a URL) that fails to start and
    echoes its arguments to stderr, plus an HTTP server with the secret in URL and headers."""
    return write_manifest(tmp_path, {
        "stdio": fault_server("--token", "${RLF_TEST_API_KEY}", env={"SERVICE_KEY": "${RLF_TEST_API_KEY}",
                                                                      "LITERAL_TOKEN": "literal-credential"}),
        "web": {"url": "http://127.0.0.1:9/mcp?key=${RLF_TEST_API_KEY}",
                "headers": {"Authorization": "Bearer ${RLF_TEST_API_KEY}", "X-Team": "team-credential-7"}}})


def assert_clean(text: str) -> None:
    for secret in (SECRET, "literal-credential", "team-credential-7"):
        assert secret not in text


def test_repr_and_transport_description(leaky):
    servers = load_manifest(leaky).servers
    for spec in servers.values():
        assert_clean(repr(spec) + str(spec) + describe_transport(spec))
    assert "'SERVICE_KEY': '***'" in repr(servers["stdio"]) and "--token ***" in describe_transport(servers["stdio"])
    assert describe_transport(servers["web"]) == "http://127.0.0.1:9/mcp?key=*** via streamable_http"


async def test_startup_failure_message_and_logs(leaky, caplog):
    caplog.set_level(logging.DEBUG)
    with pytest.raises(ToolEnvError) as info:
        async with ToolEnv.from_manifest(leaky) as env:
            await env.list_tools()
    message = str(info.value)
    assert "MCP server 'stdio'" in message and "unrecognized arguments: --token ***" in message  # its stderr
    assert "MCP server 'web'" in message
    assert_clean(message)
    assert_clean("\n".join(r.getMessage() for r in caplog.records))


async def test_server_error_that_echoes_a_credential(tmp_path, write_manifest, fault_server):
    path = write_manifest(tmp_path, {"s": fault_server(env={"SERVICE_KEY": "${RLF_TEST_API_KEY}"})})
    async with ToolEnv.from_manifest(path) as env:
        result = await env.call(ToolCall("leak", {"name": "SERVICE_KEY"}))
    assert result.error_kind == "server_error" and result.text.endswith("authentication failed for key ***")


def test_cli_never_prints_secrets(leaky, tmp_path, write_manifest, fault_server, repo_root):
    working = write_manifest(tmp_path, {"s": fault_server(env={"SERVICE_KEY": "${RLF_TEST_API_KEY}"})}, name="ok.yaml")
    for path, code in [(leaky, 2), (working, 0)]:
        out = subprocess.run([sys.executable, "-m", "envs", "list", str(path)], capture_output=True, text=True,
                             timeout=60, env={**os.environ, "PYTHONPATH": str(repo_root)})
        assert out.returncode == code, out.stderr
        assert_clean(out.stdout + out.stderr)


def test_config_yaml_masks_an_inline_manifest(tmp_path):
    from rl_factory.config import load_config, redacted

    inline = "{mcpServers:{calc:{command:python,env:{SERVICE_KEY:${oc.env:RLF_TEST_API_KEY}}}}}"
    cfg = load_config("grpo", [f"env.tools={inline}"])
    # The config keeps the reference; the manifest loader resolves it where the tools open.
    assert cfg.env.tools.mcpServers.calc.env.SERVICE_KEY == "${oc.env:RLF_TEST_API_KEY}"
    from rl_factory.components import EnvConfig
    from rl_factory.config import section

    assert load_manifest(section(cfg, "env", EnvConfig).tools).servers["calc"].env["SERVICE_KEY"] == SECRET
    text = yaml.safe_dump(redacted(cfg))
    assert_clean(text)
    assert yaml.safe_load(text)["env"]["tools"]["mcpServers"]["calc"]["env"] == {
        "SERVICE_KEY": "${oc.env:RLF_TEST_API_KEY}"}
