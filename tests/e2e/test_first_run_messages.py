"""What went wrong for a new user right after the demo, each now one line or a command that works as written."""
import os
import re
import subprocess
import sys

import pytest

from rl_factory.tracking import Tracker, TrackingError
from tests.e2e.test_main_scripts import REPO, run_script, script_env, tiny_overrides

pytestmark = pytest.mark.slow  # the launch scripts and training runs, end to end

# The README and every docs page: the commands a new user copies.
README = "\n".join(path.read_text() for path in [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))])


def _errors(result) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.startswith("error:")]


def test_readme_runs_project_modules_through_the_venv():
    """Without an active venv, bare `python ...` is the system Python (no torch, no rl_factory): every README and
    docs command names the venv, whether it runs a module or a script, with or without VAR=value before it."""
    blocks = re.findall(r"```bash\n(.*?)```", README, re.S)
    lines = [line.strip() for block in blocks for line in block.splitlines()]
    bare = [line for line in lines if re.match(r"^(\w+=\S*\s+)*python3?(\s|$)", line)]
    assert bare == []
    assert any(line.startswith(".venv/bin/python -m envs list") for line in lines)


@pytest.mark.parametrize("command, expected", [
    (r"\.venv/bin/python -m envs list configs/tools/calculator\.yaml.*", "[calculator] calculator"),
    (r"""\.venv/bin/python -m envs call configs/tools/calculator\.yaml calculator '\{"expression": "347 \* 29"\}'.*""",
     "10063"),
])
def test_readme_tools_commands_work_as_written_without_an_active_venv(command, expected):
    line = re.search(rf"^({command})$", README, re.M).group(1).split("  #")[0]
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if ".venv" not in p)
    done = subprocess.run(["bash", "-c", line], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert expected in done.stdout


def test_a_logger_without_its_package_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # as if the extra were not installed
    monkeypatch.delitem(sys.modules, "torch.utils.tensorboard", raising=False)
    with pytest.raises(TrackingError) as err:
        Tracker(tmp_path, ["jsonl", "tensorboard"])
    message = str(err.value)
    assert "logger 'tensorboard' needs the tensorboard package" in message and "[tensorboard]" in message
    assert "pip install" in message and "remove it from trainer.logger" in message


def test_a_logger_without_its_package_stops_training_before_it_writes(tiny_model_dir, tmp_path):
    # sitecustomize runs at interpreter start-up: the training process sees no tensorboard package.
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text("import sys\nsys.modules['tensorboard'] = None\n")
    env = {**script_env(), "PYTHONPATH": str(tmp_path / "site")}
    run = tmp_path / "run"
    overrides = [*tiny_overrides(tiny_model_dir, run, REPO / "configs" / "tools" / "calculator.yaml"),
                 "trainer.logger=[console,jsonl,tensorboard]"]
    result = subprocess.run(["bash", "main_grpo.sh", *overrides], cwd=REPO, env=env, capture_output=True, text=True,
                            timeout=180)
    assert result.returncode == 2, result.stderr[-2000:]
    assert len(_errors(result)) == 1 and "needs the tensorboard package" in _errors(result)[0]
    assert "Traceback" not in result.stderr and not run.exists()


@pytest.mark.parametrize("offline", [True, False], ids=["offline_mode", "hub_unreachable"])
def test_a_hub_model_without_network_is_one_line(offline, tmp_path):
    env = {**script_env(), "HF_HOME": str(tmp_path / "hf"), "HF_ENDPOINT": "http://127.0.0.1:9"}  # nothing listens
    for key in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        env.pop(key, None)
    if offline:
        env["HF_HUB_OFFLINE"] = "1"
    result = subprocess.run(["bash", "main_eval.sh", "model.path=Qwen/Qwen3-0.6B", "eval.limit=1", "model.device=cpu",
                             f"eval.output_dir={tmp_path / 'eval'}"], cwd=REPO, env=env, capture_output=True,
                            text=True, timeout=180)
    assert result.returncode == 2, result.stderr[-2000:]
    errors = _errors(result)
    assert len(errors) == 1 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert "model.path=Qwen/Qwen3-0.6B is not in the local Hugging Face cache" in errors[0]
    assert ("offline mode is on" if offline else "http://127.0.0.1:9) is unreachable") in errors[0]
    assert "model.path=/path/to/model" in errors[0] and "HF_HUB_OFFLINE=1" in errors[0]
    assert "Retrying" not in result.stderr


GHOST_SERVER = "env.tools={mcpServers: {ghost: {command: rlf-no-such-command-xyz}}}"


@pytest.mark.parametrize("script", ["main_grpo.sh", "main_eval.sh"])
@pytest.mark.parametrize("failure", ["hub_unreachable", "server_cannot_start"])
def test_a_run_that_fails_its_start_up_checks_writes_nothing(script, failure, tiny_model_dir, tmp_path):
    """No run.json, config.yaml, train.log or tool_logs/ for a model that cannot be had or a server that
    cannot start: the output directory is not even created."""
    env = {**script_env(), "HF_HOME": str(tmp_path / "hf"), "HF_ENDPOINT": "http://127.0.0.1:9"}  # nothing listens
    for key in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        env.pop(key, None)
    out = tmp_path / "outputs" / "run"
    overrides = (["model.path=Qwen/Qwen3-0.6B"] if failure == "hub_unreachable" else
                 [f"model.path={tiny_model_dir}", GHOST_SERVER])
    overrides += [f"trainer.output_dir={out}", "model.device=cpu"] if script == "main_grpo.sh" else \
        [f"eval.output_dir={out}", "eval.limit=1", "model.device=cpu"]
    result = subprocess.run(["bash", script, *overrides], cwd=REPO, env=env, capture_output=True, text=True,
                            timeout=180)
    assert result.returncode == 2, result.stderr[-2000:]
    errors = _errors(result)
    assert len(errors) == 1 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert ("is unreachable" if failure == "hub_unreachable" else "'ghost'") in errors[0]
    assert not (tmp_path / "outputs").exists(), sorted(p.name for p in (tmp_path / "outputs").rglob("*"))
