"""Every shell command in README.md and the docs pages works as written.

Each ```bash block parses (`bash -n`); every command names the venv's Python (bare `python` is the system's);
every file of the repository it names exists; every `key=value` of a `bash main_grpo.sh` / `main_eval.sh`
command is a key the config has (composed in-process the way `--cfg job` composes it, verl's keys
included), and one the page shows failing (`# error: ...` after it) fails with that line; and the cheap ones
run: `python -m envs list|call`, `--help`, `--cfg job`.
"""
from __future__ import annotations

import contextlib
import io
import os
import re
import subprocess
import sys

import pytest

from tests import tiers
from tests.docs.markdown import REPO, Command, bash_blocks, commands, program

BLOCKS = bash_blocks()
COMMANDS = [c for b in BLOCKS for c in commands(b)]
TOP_LEVEL = {p.name for p in REPO.iterdir() if not p.name.startswith(".")} | {".venv", ".ci"}
PLACEHOLDER = re.compile(r"[<>*$]|\.\.\.|\{|\}")


def _where(block) -> str:
    return f"{block.path.relative_to(REPO)}:{block.line}"


def test_there_are_commands_to_check():
    assert len(BLOCKS) >= 10 and len(COMMANDS) >= 30


@pytest.mark.parametrize("block", BLOCKS, ids=_where)
def test_each_bash_block_parses(block):
    done = subprocess.run(["bash", "-n"], input=block.text, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, f"{_where(block)}: {done.stderr.strip()}"


def test_commands_name_the_venv_not_a_bare_python():
    bare = [c.where for c in COMMANDS if program(c.words)[:1] and program(c.words)[0] in ("python", "python3", "pip", "pip3")]
    assert bare == [], "use .venv/bin/python (bare python is the system's): " + "; ".join(bare)


def _repo_paths(words: list[str]) -> list[str]:
    """Words (or the value of a key=value word) that name a path inside the repository."""
    found = []
    for word in words:
        value = word.split("=", 1)[1] if re.match(r"^[+~]?[\w.]+=", word) else word
        for part in value.strip("[]").split(","):
            path = part.split(":")[0] if re.search(r"\.py:\w+$", part) else part
            if "/" not in path or PLACEHOLDER.search(path) or path.startswith(("http", "/", "-", "pkg:", "builtin:")):
                continue
            if path.split("/")[0] in TOP_LEVEL and not path.startswith(("outputs/", ".venv/")):
                found.append(path)
    return found


def _ignored(path: str) -> bool:
    """Paths git ignores are made by a command (a data script, an install): they need not exist beforehand."""
    return subprocess.run(["git", "check-ignore", "-q", path], cwd=REPO).returncode == 0


def test_every_repository_path_a_command_names_exists():
    missing = [f"{c.where} -> {p}" for c in COMMANDS for p in _repo_paths(program(c.words))
               if not (REPO / p).exists() and not _ignored(p)]
    assert missing == [], "; ".join(missing)


def _main_script_commands() -> list[tuple[Command, str, list[str]]]:
    """(command, train|eval, overrides) for each `bash main_grpo.sh|main_eval.sh ...` with no placeholder."""
    out = []
    for c in COMMANDS:
        words = program(c.words)
        if len(words) < 2 or words[0] != "bash" or words[1] not in ("main_grpo.sh", "main_eval.sh"):
            continue
        overrides = [w for w in words[2:] if not w.startswith("--") and w != "job"]
        if any(PLACEHOLDER.search(w) for w in overrides) or any(not re.match(r"^[+~]?[\w.]+=", w) for w in overrides):
            continue
        out.append((c, "train" if words[1] == "main_grpo.sh" else "eval", overrides))
    return out


MAIN = _main_script_commands()


def test_the_main_script_commands_are_checked():
    assert len(MAIN) >= 5


def _compose(mode: str, overrides: list[str]) -> str | None:
    """None if `bash main_<mode>.sh <overrides> --cfg job` composes; else the one-line error it would print."""
    from rl_factory.cli import USER_ERRORS, _backend_train
    from rl_factory.config import load_config

    try:
        with contextlib.redirect_stdout(io.StringIO()):
            if mode == "train":
                _backend_train(overrides, "job")
            else:
                load_config("eval", overrides)
    except USER_ERRORS as exc:
        return str(exc)
    return None


@pytest.mark.slow  # composes every documented command's config, verl's too (~15 s)
def test_every_override_in_the_docs_is_a_config_key(monkeypatch):
    monkeypatch.chdir(REPO)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    errors, seen = [], set()
    for c, mode, overrides in MAIN:
        if (mode, *overrides) in seen:
            continue
        seen.add((mode, *overrides))
        if any(w.startswith("trainer.backend=verl") for w in overrides):
            pytest.importorskip("verl", reason="verl's keys need .[verl-cpu] (bash setup.sh --dev)")
        error = _compose(mode, overrides)
        if c.shown_error is not None:
            errors += _shown_error_problems(c, error)
        elif error:
            errors.append(f"{c.where}: {error}")
    assert errors == [], "\n".join(errors)


def _shown_error_problems(c: Command, error: str | None) -> list[str]:
    """A command the page shows failing fails with the line shown. A `--cfg job` or `--doctor` command must
    fail so when composed; a run's refusal may come later than `--cfg job` gets (the capability table)."""
    shown = c.shown_error.removesuffix("...").rstrip()
    if error is None:
        strict = any(w in ("--cfg", "--doctor") for w in c.words)
        return [f"{c.where}: composes, but the page shows it failing with: {shown}"] if strict else []
    return [] if error.startswith(shown) else [f"{c.where}: fails with {error!r}, the page shows: {shown}"]


def test_the_override_check_rejects_a_misspelled_key(monkeypatch):
    monkeypatch.chdir(REPO)
    assert "unknown config key" in (_compose("train", ["rollout.nn=4"]) or "")
    assert _compose("train", ["rollout.n=4"]) is None


def _runnable(c: Command) -> bool:
    words = program(c.words)
    text = " ".join(words)
    if re.search(r"[<>]|\.\.\.", text) or c.words != words:  # placeholders; env vars (RAY_ADDRESS=...) need their service
        return False
    if text.startswith((".venv/bin/python -m envs list ", ".venv/bin/python -m envs call ")):
        # a manifest the page makes first (`envs new-server`) is run by tests/e2e/test_first_task.py instead
        return len(words) > 4 and (REPO / words[4]).exists()
    return (words[-1:] == ["--help"]
            or (text.startswith("bash main_") and "--cfg job" in text and "trainer.backend=verl" not in text))


def _kind(c: Command) -> tuple[str, ...]:
    """Commands of one kind exercise the same code: `envs list|call <manifest>`, a script's `--help` or `--cfg job`."""
    words = program(c.words)
    if words[:3] == [".venv/bin/python", "-m", "envs"]:
        return tuple(words[3:5])
    return (words[0], words[1] if len(words) > 1 else "", "--help" if words[-1] == "--help" else "--cfg")


# One command of each kind: the docs tests stay within a minute on two cores.
RUNNABLE = list({_kind(c): c for c in reversed(COMMANDS) if _runnable(c)}.values())


@pytest.mark.parametrize("command", [pytest.param(c, marks=pytest.mark.slow) if tiers.launches(c.text) else c
                                     for c in RUNNABLE], ids=lambda c: c.where[:80])
def test_the_cheap_commands_run_as_written(command):
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env["HF_HUB_OFFLINE"] = "1"
    done = subprocess.run(["bash", "-c", command.text], cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL)
    # `envs call` exits 1 when the tool itself answers with an error, which a page may show on purpose
    tool_error = done.returncode == 1 and "Error executing tool" in done.stdout and not done.stderr.strip()
    assert done.returncode == 0 or tool_error, f"{command.where}\n{done.stderr[-2000:]}"


ENTRY_POINTS = ["envs list", "envs call", "rl_factory.report", "rl_factory.rescore"]


@pytest.mark.parametrize("module", ENTRY_POINTS)
def test_every_option_of_an_entry_point_is_in_the_cli_reference(module):
    """The CLI reference cannot fall behind the code: each option `--help` lists is on the page."""
    done = subprocess.run([sys.executable, "-m", *module.split(), "--help"], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    options = set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", done.stdout)) - {"--help"}
    page = (REPO / "docs" / "reference" / "cli.md").read_text()
    assert module.split()[0] in page
    assert sorted(o for o in options if o not in page) == []
