"""Secrets never leave, wherever a value can surface: `--cfg job`, config.yaml, the config handed to
verl (whose TaskRunner prints it resolved), log records with tracebacks, uncaught tracebacks and
error lines. (Tool results, rollouts and tool_logs: tests/envs/test_tool_limits.py.)

The secret enters the way users pass keys: `${oc.env:VAR}` in an inline manifest, under keys that
are not named like secrets too (an `args` entry, a URL).
"""
import io
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

pytestmark = pytest.mark.slow  # the CLI and the launch scripts in subprocesses

REPO_ROOT = Path(__file__).resolve().parents[1]
SECRET = "sk-proj-" + "5e0c3b9d1a7f42"
VAR = "RLF_EVERYWHERE_API_KEY"
INLINE = ("env.tools={mcpServers:{search:{url:'http://127.0.0.1:9/mcp?key=${oc.env:%s}',"
          "headers:{X-Team:'team ${oc.env:%s}'}},calc:{command:python,args:[-m,envs.servers.calculator,"
          "--auth,'${oc.env:%s}']}}}" % (VAR, VAR, VAR))


@pytest.fixture(autouse=True)
def secret_env(monkeypatch):
    monkeypatch.setenv(VAR, SECRET)


def cli(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rl_factory.cli", *args], capture_output=True, text=True,
                          timeout=300, cwd=REPO_ROOT, env={**os.environ, "PYTHONPATH": str(REPO_ROOT), **env})


def test_cfg_job_prints_references_not_values():
    out = cli("train", INLINE, "--cfg", "job")
    assert out.returncode == 0, out.stderr
    assert SECRET not in out.stdout + out.stderr
    printed = yaml.safe_load(out.stdout)["env"]["tools"]["mcpServers"]
    assert printed["calc"]["args"][-1] == "${oc.env:%s}" % VAR  # provenance kept, under a plain key
    assert printed["search"]["url"] == "http://127.0.0.1:9/mcp?key=${oc.env:%s}" % VAR


def test_config_yaml_keeps_the_reference_under_any_key():
    from rl_factory.config import load_config, redacted

    cfg = load_config("grpo", [INLINE, "+algorithm.arena.judge.token=literal-token-123"])
    written = yaml.safe_dump(redacted(cfg))
    assert SECRET not in written and "literal-token-123" not in written
    data = yaml.safe_load(written)
    assert data["env"]["tools"]["mcpServers"]["calc"]["args"][-1] == "${oc.env:%s}" % VAR
    assert data["algorithm"]["arena"]["judge"]["token"] == "***"


def test_the_config_handed_to_verl_prints_no_secret_and_still_works(tmp_path):
    pytest.importorskip("verl", reason="verl is an extra: bash setup.sh --dev (verl-cpu)")
    from rl_factory.backends.verl.config import compose_verl
    from rl_factory.backends.verl.launcher import absolute
    from rl_factory.config import load_config, parse, worker_config
    from envs.manifest import load_manifest

    ours = absolute(parse(load_config("grpo", ["trainer.backend=verl", f"trainer.output_dir={tmp_path}", INLINE])))
    cfg = worker_config(compose_verl(ours, [], {"train": "/t.parquet", "val": "/v.parquet"}, "/model"))
    printed = str(OmegaConf.to_container(cfg, resolve=True))  # what verl's TaskRunner pprints
    assert SECRET not in printed and "${oc.env:%s}" % VAR in printed
    OmegaConf.resolve(cfg)  # what TaskRunner does next; then our agent loop and reward worker read it
    for tools in (parse(cfg.rl_factory).env.tools,
                  OmegaConf.to_container(cfg.reward.custom_reward_function.reward_kwargs, resolve=True)
                  ["rl_factory"]["tools"]):
        servers = load_manifest(tools).servers
        assert servers["calc"].args[-1] == SECRET and servers["search"].headers["X-Team"] == f"team {SECRET}"


def test_log_tracebacks_are_scrubbed():
    from rl_factory.config import load_config

    load_config("grpo", [INLINE])  # registers the secret, as a run does
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    log = logging.getLogger("rl_factory.test_secrets_everywhere")
    log.addHandler(handler)
    try:
        try:
            raise RuntimeError(f"upstream said: invalid key {SECRET}")
        except RuntimeError:
            log.exception("calling the judge failed for %s", SECRET)
    finally:
        log.removeHandler(handler)
    text = stream.getvalue()
    assert "RuntimeError: upstream said: invalid key" in text and SECRET not in text


@pytest.mark.parametrize("debug", ["", "1"])
def test_error_lines_and_uncaught_tracebacks_are_scrubbed(debug, tmp_path):
    # A path built from the key: the error names it (one line, or a traceback with RL_FACTORY_DEBUG=1).
    # Its own output directory: a finished default run in outputs/ (after `bash main_grpo.sh`) is refused first.
    out = cli("train", "reward.function=/nonexistent/${oc.env:%s}.py:reward" % VAR, f"trainer.output_dir={tmp_path}",
              RL_FACTORY_DEBUG=debug)
    assert out.returncode != 0
    assert "reward file not found" in out.stderr and SECRET not in out.stderr + out.stdout
    assert ("Traceback" in out.stderr) == bool(debug)
