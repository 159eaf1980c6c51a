"""`python -m envs new-server NAME`: a task of one's own, ready to train.

Writes `DIR/NAME/` with an MCP server (two tools, on mcp 2.x's `MCPServer`), its manifest, a reward,
and five training and five validation rows, then prints the commands that check, train and evaluate
it. The files are a starting point to edit: the example task counts words, which the server's
`word_count` tool does exactly and a small model cannot do in its head.

Paths in the printed commands are relative to the working directory the command was run from (the
scripts resolve them there), and the manifest names `server.py` relative to itself, so the task
trains from any directory and can be moved as a whole.
"""
from __future__ import annotations

import json
import os
import re
import shlex
from pathlib import Path

from envs.manifest import PROJECT_ROOT

NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,63}")

SERVER = '''"""The {name} MCP server: the tools the model may call (stdio; `--http PORT` serves streamable HTTP).

Try it without a model:
    .venv/bin/python -m envs list {manifest}
    .venv/bin/python -m envs call {manifest} word_count '{{"text": "one two three"}}'
"""
import argparse

from mcp.server.mcpserver import MCPServer  # mcp 2.x (mcp.server.fastmcp is the 1.x name)

mcp = MCPServer("{name}")


@mcp.tool()
def word_count(text: str) -> int:
    """Count the words in a text (runs of characters between whitespace)."""
    return len(text.split())


@mcp.tool()
def char_count(text: str, spaces: bool = True) -> int:
    """Count the characters in a text; spaces=false leaves whitespace out."""
    return len(text) if spaces else len("".join(text.split()))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--http", type=int, default=None, help="serve streamable HTTP on this port (URL /mcp)")
    args = parser.parse_args()
    if args.http is None:
        mcp.run()  # stdio: what the manifest starts; stdout carries the protocol, so log to stderr
    else:
        mcp.run("streamable-http", host="127.0.0.1", port=args.http)
'''

MANIFEST = '''# Tool manifest of the {name} task: the "mcpServers" shape desktop MCP clients use.
# Check it with: .venv/bin/python -m envs list {manifest}
mcpServers:
  {name}:
    # "python" is the trainer's own interpreter; server.py is found next to this file
    command: python
    args: [server.py]
    # Seconds one call may take before the model sees a "timeout" error
    timeout_s: 10
'''

REWARD = '''"""Reward of the {name} task: 1.0 when the completion's last number is the reference answer."""
import re


def reward(completion: str, answer: str, **_) -> float:
    numbers = re.findall(r"-?\\d+", completion)
    return float(bool(numbers) and numbers[-1] == str(answer).strip())
'''

TEXTS = {
    "train": ["the cat sat on the mat", "a stitch in time saves nine", "to be or not to be that is the question",
              "all that glitters is not gold", "the early bird catches the worm every single morning"],
    "val": ["knowledge is power", "actions speak louder than words", "where there is smoke there is fire",
            "practice makes perfect", "the pen is mightier than the sword"],
}


def rows(split: str) -> list[dict]:
    return [{"prompt": f'How many words are in this text: "{text}"?', "answer": str(len(text.split()))}
            for text in TEXTS[split]]


def scaffold(name: str, parent: Path) -> Path:
    """Write the task's files into `parent/name` (which must not exist yet) and return that directory."""
    if not NAME.fullmatch(name):
        raise ValueError(f"NAME {name!r}: use letters, digits and _, starting with a letter (it names the server)")
    task = parent.resolve() / name
    if task.exists():
        raise FileExistsError(f"{task} exists already: pick another NAME or --dir (nothing was written)")
    manifest = display(task / "tools.yaml")
    files = {
        "server.py": SERVER.format(name=name, manifest=manifest),
        "tools.yaml": MANIFEST.format(name=name, manifest=manifest),
        "reward.py": REWARD.format(name=name),
        "train.jsonl": "".join(json.dumps(r) + "\n" for r in rows("train")),
        "val.jsonl": "".join(json.dumps(r) + "\n" for r in rows("val")),
    }
    task.mkdir(parents=True)
    for file, text in files.items():
        (task / file).write_text(text, encoding="utf-8")
    return task


def display(path: Path) -> str:
    """`path` as the user would type it here: relative to the working directory when under it."""
    try:
        return str(path.relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def train_overrides(task: Path, name: str) -> list[str]:
    """The overrides that train the scaffolded task (paths as `display` writes them)."""
    return [f"env.tools={display(task / 'tools.yaml')}", f"reward.function={display(task / 'reward.py')}:reward",
            f"data.train_files={display(task / 'train.jsonl')}", f"data.val_files={display(task / 'val.jsonl')}",
            f"experiment_name={name}"]


def commands(task: Path, name: str) -> dict[str, str]:
    """The commands printed after scaffolding: list and call its tools, check, train, evaluate."""
    script = {s: display(PROJECT_ROOT / s) for s in ("main_grpo.sh", "main_eval.sh")}
    python = display(PROJECT_ROOT / ".venv" / "bin" / "python") if (PROJECT_ROOT / ".venv").exists() else "python"
    train = " ".join(["bash", script["main_grpo.sh"], *map(shlex.quote, train_overrides(task, name))])
    run_dir = display(PROJECT_ROOT / "outputs" / name)
    return {
        "tools": f"{python} -m envs list {display(task / 'tools.yaml')}",
        "call": f"{python} -m envs call {display(task / 'tools.yaml')} word_count " + shlex.quote('{"text": "a b c"}'),
        "doctor": f"{train} --doctor",
        "train": f"{train} trainer.total_steps=3",
        "eval": " ".join(["bash", script["main_eval.sh"], f"model.path={run_dir}/checkpoints/step_000003",
                          *map(shlex.quote, train_overrides(task, name)[:2]),
                          f"eval.files={display(task / 'val.jsonl')}"]),
    }


def print_next_steps(task: Path, name: str) -> None:
    listed = ", ".join(sorted(p.name for p in task.iterdir()))
    cmd = commands(task, name)
    print(f"wrote {display(task)}{os.sep}: {listed}\n"
          f"\ntry its tools:\n  {cmd['tools']}\n  {cmd['call']}\n"
          f"\ncheck the setup (no training):\n  {cmd['doctor']}\n"
          f"\ntrain 3 steps (raise trainer.total_steps for a real run; the run directory is "
          f"{display(PROJECT_ROOT / 'outputs' / name)}):\n  {cmd['train']}\n"
          f"\nevaluate the checkpoint:\n  {cmd['eval']}")
