"""Where relative paths resolve: the scripts' overrides against the caller's directory (rl_factory.paths),
a manifest's launch line against the manifest's directory (envs.manifest)."""
import sys
from pathlib import Path

import pytest

from envs.manifest import load_manifest
from rl_factory.paths import CALLER_CWD_ENV, caller_paths

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def caller(tmp_path, monkeypatch):
    (tmp_path / "task").mkdir()
    for name in ("tools.yaml", "train.jsonl", "b.jsonl", "reward.py"):
        (tmp_path / "task" / name).write_text("")
    (tmp_path / "ckpt").mkdir()
    monkeypatch.setenv(CALLER_CWD_ENV, str(tmp_path))
    return tmp_path


def test_overrides_resolve_against_the_callers_directory(caller):
    got = caller_paths(["env.tools=task/tools.yaml", "data.train_files=task/train.jsonl",
                        "data.val_files=[task/train.jsonl,task/b.jsonl]", "reward.function=task/reward.py:reward",
                        "model.path=ckpt", "trainer.output_dir=runs/a", "+trainer.resume=never",
                        "eval.files=missing.jsonl"], project_dir=REPO)
    assert got == [f"env.tools={caller}/task/tools.yaml", f"data.train_files={caller}/task/train.jsonl",
                   f"data.val_files=[{caller}/task/train.jsonl,{caller}/task/b.jsonl]",
                   f"reward.function={caller}/task/reward.py:reward", f"model.path={caller}/ckpt",
                   f"trainer.output_dir={caller}/runs/a", "+trainer.resume=never",
                   f"eval.files={caller}/missing.jsonl"]  # missing: the error will name this path


def test_what_is_not_a_callers_file_stays(caller):
    kept = ["model.path=Qwen/Qwen3-0.6B", "model.path=builtin:tiny-calculator", "reward.function=rewards.rules:f",
            "env.tools={mcpServers: {}}", "env.tools=null", "rollout.n=4", "data.train_files=/abs/x.jsonl",
            "data.train_files=examples/calculator/data/train.jsonl",  # only the project has it: as the docs write it
            "env.environment=examples/guess/environment.py:GuessEnv", "trainer.resume=auto"]
    assert caller_paths(kept, project_dir=REPO) == kept


def test_started_from_the_project_directory_nothing_changes(monkeypatch):
    monkeypatch.setenv(CALLER_CWD_ENV, str(REPO))
    assert caller_paths(["env.tools=tools.yaml"], project_dir=REPO) == ["env.tools=tools.yaml"]
    monkeypatch.delenv(CALLER_CWD_ENV)
    assert caller_paths(["env.tools=tools.yaml"], project_dir=REPO) == ["env.tools=tools.yaml"]


def test_a_manifests_launch_line_resolves_next_to_the_manifest(tmp_path, monkeypatch):
    task = tmp_path / "task"
    (task / "data").mkdir(parents=True)
    (task / "server.py").write_text("")
    (task / "bin").mkdir()
    (task / "bin" / "their-server").write_text("")
    (task / "tools.yaml").write_text(
        "mcpServers:\n"
        "  theirs: {command: bin/their-server}\n"
        "  on_path: {command: node, args: [server.py]}\n"
        "  mine: {command: python, args: [server.py, --db, data, -m, envs.servers.calculator, not_here.txt]}\n"
        "  pinned: {command: python, args: [server.py], cwd: data}\n")
    monkeypatch.chdir(REPO)
    servers = load_manifest(task / "tools.yaml").servers
    assert servers["mine"].command == sys.executable
    assert servers["mine"].args == [str(task / "server.py"), "--db", str(task / "data"), "-m",
                                    "envs.servers.calculator", "not_here.txt"]
    assert servers["theirs"].command == str(task / "bin" / "their-server")
    assert servers["on_path"].command == "node" and servers["on_path"].args == [str(task / "server.py")]
    # with a cwd, the arguments are the child's own (relative to that cwd); the cwd is the manifest's
    assert servers["pinned"].args == ["server.py"] and servers["pinned"].cwd == str(task / "data")
