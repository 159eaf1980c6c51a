"""A task of one's own, the way docs/quickstart.md writes it: scaffold it from another directory, list and call
its tools, `--doctor` it, train it and evaluate its checkpoint with the commands the scaffold printed.

The builtin model is already in the (private) cache, built for the calculator: the new task's manifest must
reuse it, not start a build of its own. benchmarks/first_task.py times the same path from an empty cache.
"""
import json
import shlex
import shutil
import subprocess
import sys

import pytest

from rl_factory.models.tiny import built_dir
from tests.e2e.test_main_scripts import REPO, script_env
from tests.records import jsonl

pytestmark = pytest.mark.slow  # the launch scripts and training runs, end to end

SPEED = ["model.device=cpu", "data.train_batch_size=2", "rollout.n=2", "rollout.max_response_tokens=32",
         "trainer.output_dir=run"]  # relative: the caller's directory


@pytest.fixture(scope="module")
def task(tiny_model_dir, tmp_path_factory):
    home = tmp_path_factory.mktemp("first_task")
    cache = home / "cache"
    shutil.copytree(tiny_model_dir, cache / "models" / built_dir().name)
    env = {**script_env(), "RL_FACTORY_CACHE": str(cache)}
    done = subprocess.run([sys.executable, "-m", "envs", "new-server", "word_count", "--dir", "tasks"], cwd=home,
                          env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    printed = [line.strip() for line in done.stdout.splitlines() if line.startswith("  ")]
    return {"home": home, "cache": cache, "env": env, "stdout": done.stdout, "dir": home / "tasks" / "word_count",
            "commands": dict(zip(["list", "call", "doctor", "train", "eval"], printed, strict=True))}


def run(task, command: str, *more: str, timeout: int = 900) -> subprocess.CompletedProcess:
    return subprocess.run([*shlex.split(command), *more], cwd=task["home"], env=task["env"], capture_output=True,
                          text=True, timeout=timeout)


def test_the_scaffold_writes_a_task_and_the_commands_that_use_it(task):
    assert sorted(p.name for p in task["dir"].iterdir()) == ["reward.py", "server.py", "tools.yaml", "train.jsonl",
                                                            "val.jsonl"]
    for split in ("train", "val"):
        rows = [json.loads(line) for line in (task["dir"] / f"{split}.jsonl").read_text().splitlines()]
        assert len(rows) == 5 and all(r["answer"] == str(len(r["prompt"].split('"')[1].split())) for r in rows)
    cmd = task["commands"]
    assert cmd["train"].startswith(f"bash {REPO}/main_grpo.sh env.tools=tasks/word_count/tools.yaml ")
    assert "reward.function=tasks/word_count/reward.py:reward" in cmd["train"] and cmd["doctor"].endswith("--doctor")
    again = subprocess.run([sys.executable, "-m", "envs", "new-server", "word_count", "--dir", "tasks"],
                           cwd=task["home"], env=task["env"], capture_output=True, text=True, timeout=60)
    assert again.returncode == 2 and "exists already" in again.stderr and str(task["dir"]) in again.stderr


def test_its_server_lists_and_answers(task):
    listed = run(task, task["commands"]["list"])
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.splitlines()[0].startswith("[word_count] word_count: Count the words in a text")
    assert "[word_count] char_count:" in listed.stdout
    called = run(task, task["commands"]["call"])
    assert (called.returncode, called.stdout) == (0, "3\n"), called.stderr


def test_doctor_passes_and_says_no_build_is_coming(task):
    done = run(task, task["commands"]["doctor"])
    assert done.returncode == 0, done.stdout + done.stderr[-2000:]
    assert "all checks passed" in done.stdout and "2 tool(s) listed (word_count: 2)" in done.stdout
    assert "builtin:tiny-calculator is built" in done.stdout and "no build before the first step" in done.stdout


def test_it_trains_with_the_builtin_model_and_the_checkpoint_evaluates(task):
    before = sorted(p.name for p in (task["cache"] / "models").iterdir())
    done = run(task, task["commands"]["train"], *SPEED)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "building" not in done.stderr  # the calculator's model, reused for this manifest
    assert sorted(p.name for p in (task["cache"] / "models").iterdir()) == before
    run_dir = task["home"] / "run"  # trainer.output_dir=run, relative to where the command ran
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [0, 1, 2, 3] and "val/accuracy" in metrics[-1]
    config = (run_dir / "config.yaml").read_text()
    assert f"tools: {task['dir']}/tools.yaml" in config
    assert (run_dir / "tool_logs" / "word_count.log").exists()
    records = jsonl(run_dir / "rollouts" / "step_000001.jsonl")
    assert len(records) == 4 and all(r["reward"] in (0.0, 1.0) for r in records)

    evaluate = task["commands"]["eval"].replace(f"model.path={REPO}/outputs/word_count/", "model.path=run/")
    done = run(task, evaluate, "model.device=cpu", "rollout.max_response_tokens=32")
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads((run_dir / "checkpoints" / "step_000003" / "eval" / "results.json").read_text())
    assert len(results["per_row"]) == 5


def test_the_quickstart_shows_the_commands_the_scaffold_prints_from_the_repository_root(monkeypatch):
    from envs.scaffold import commands

    monkeypatch.chdir(REPO)
    page = (REPO / "docs" / "quickstart.md").read_text()
    for name, command in commands(REPO / "word_count", "word_count").items():
        assert f"\n  {command}\n" in page, (name, command)
    assert f"\n{commands(REPO / 'word_count', 'word_count')['eval']}\n" in page  # section 3 runs it as printed
