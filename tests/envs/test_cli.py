"""`python -m envs list|call` as a user runs it: a subprocess, from a directory outside the repo."""
import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow  # the tools CLI in subprocesses (its documented commands run in tests/docs/test_commands.py)


@pytest.fixture
def cli(tmp_path, repo_root):
    def run(*args: str) -> subprocess.CompletedProcess:
        env = {**os.environ, "PYTHONPATH": str(repo_root)}
        return subprocess.run([sys.executable, "-m", "envs", *map(str, args)], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=60)
    return run


def test_list(cli, calculator_manifest):
    out = cli("list", calculator_manifest)
    assert out.returncode == 0, out.stderr
    header, schema = out.stdout.splitlines()
    assert header == ("[calculator] calculator: Evaluate an arithmetic expression with + - * / // % ** "
                      "and parentheses.")
    assert json.loads(schema)["required"] == ["expression"]


def test_call_ok_and_tool_error(cli, calculator_manifest):
    out = cli("call", calculator_manifest, "calculator", '{"expression": "2 ** 10 + 1"}')
    assert (out.returncode, out.stdout) == (0, "1025\n")
    out = cli("call", calculator_manifest, "calculator", '{"expression": "1 / 0"}')
    assert (out.returncode, out.stdout) == (1, "Error executing tool calculator: division by zero\n")


def test_bad_manifest_and_unreachable_server(cli, tmp_path, write_manifest):
    bad = write_manifest(tmp_path, {"calc": {"comand": "python"}}, name="bad.yaml")
    web = write_manifest(tmp_path, {"web": {"url": "http://127.0.0.1:9/mcp"}}, name="web.yaml")
    for args, expected in [(("list", bad), "unknown key 'comand'"),
                           (("call", tmp_path / "nope.yaml", "x"), "tool manifest not found"),
                           (("list", web), "MCP server 'web' (http://127.0.0.1:9/mcp via streamable_http) "
                                           "failed to start")]:
        out = cli(*args)
        assert out.returncode == 2
        assert len(out.stderr.splitlines()) == 1 and expected in out.stderr and "Traceback" not in out.stderr


def test_docs_tools_example_works_as_written(cli, tmp_path, repo_root):
    section = (repo_root / "docs" / "guides" / "tools.md").read_text().split("\n## Per-server knobs\n", 1)[1]
    (tmp_path / "tools.yaml").write_text(section.split("```yaml\n", 1)[1].split("```", 1)[0])
    out = cli("list", tmp_path / "tools.yaml")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("[calculator] calculator__calculator: Evaluate an arithmetic expression")
    assert lines[2] == "[functions] evaluate: Evaluate an arithmetic expression safely."
    out = cli("call", tmp_path / "tools.yaml", "evaluate", '{"expression": "6 * 7"}')
    assert (out.returncode, out.stdout) == (0, "42\n")
