"""A tiny stateful MCP server for episode tests: notes kept in this process's memory (and optionally a file).

    python tests/fakes/notes_server.py [--tag TAG] [--file PATH] [WORD ...]

`put` and `get` show whether two trajectories share state (they share it exactly when they share the
process, or the file); `whoami` reports the process id (and its parent's), tag, working directory and NOTES_ENV, so tests can
see what the manifest's `${sample.*}` / `${episode.*}` values became; `lookup(db_id, key)` has an argument
a manifest hides and fills from the sample.
"""
import argparse
import json
import os
from pathlib import Path

from mcp.server.mcpserver import MCPServer

server = MCPServer("notes", log_level="WARNING")
NOTES: dict[str, str] = {}
ARGS = argparse.Namespace(tag="", file=None)


def _load() -> dict[str, str]:
    if ARGS.file and Path(ARGS.file).exists():
        return json.loads(Path(ARGS.file).read_text())
    return NOTES


@server.tool()
def put(key: str, value: str) -> str:
    """Keep `value` under `key`."""
    notes = _load()
    notes[key] = value
    if ARGS.file:
        Path(ARGS.file).write_text(json.dumps(notes))
    return f"kept {key}"


@server.tool()
def get(key: str) -> str:
    """The value kept under `key`, or "(none)"."""
    return _load().get(key, "(none)")


@server.tool()
def whoami() -> str:
    """This process: pid, parent pid, tag, cwd and $NOTES_ENV, as JSON."""
    return json.dumps({"pid": os.getpid(), "ppid": os.getppid(), "tag": ARGS.tag, "cwd": os.getcwd(),
                       "env": os.environ.get("NOTES_ENV")})


@server.tool()
def lookup(db_id: str, key: str) -> str:
    """`key` looked up in database `db_id` (echoed: tests check which database a call reached)."""
    return f"{db_id}:{key}"


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--tag", default="")
    parser.add_argument("--file", default=None)
    parser.add_argument("words", nargs="*")  # ignored: a place for a sample value that is not an option
    ARGS = parser.parse_args()
    server.run()
