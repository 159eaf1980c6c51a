"""How a stdio server's launch line is completed from where its manifest lies (envs.manifest's rules):

  * `command: python` (or `python3`) means this interpreter, `sys.executable`;
  * a relative `command` path, `cwd` or argument that exists next to the manifest is made absolute there;
  * the child's `PYTHONPATH` gets the project root, the manifest's git repository and ours.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, Protocol, TypeVar

# The directory that holds the `envs` package: added to every stdio child's PYTHONPATH.
PROJECT_ROOT = Path(__file__).resolve().parent.parent
PYTHON_COMMANDS = {"python", "python3"}


class StdioSpec(Protocol):
    """The fields of a stdio server's entry read here (`envs.manifest.ServerSpec`, which imports this module)."""

    command: str | None
    args: list[str]
    env: dict[str, str]
    cwd: str | None

    def model_copy(self, *, update: dict[str, Any]) -> Any: ...


Spec = TypeVar("Spec", bound=StdioSpec)


def resolve_stdio(spec: Spec, repo: Path | None, base_dir: Path | None = None,
                  listing: frozenset[str] = frozenset()) -> Spec:
    """`spec` with `python` made this interpreter, PYTHONPATH completed, and relative paths that exist next to
    the manifest made absolute there."""
    command = sys.executable if spec.command in PYTHON_COMMANDS else spec.command
    paths = [spec.env.get("PYTHONPATH", ""), str(PROJECT_ROOT),
             str(repo) if repo else "", os.environ.get("PYTHONPATH", "")]
    pythonpath = os.pathsep.join(dict.fromkeys(p for p in paths if p))  # ordered, no duplicates
    update = {"command": command, "env": {**spec.env, "PYTHONPATH": pythonpath}}
    if base_dir is not None and os.sep in command:  # a bare name is looked up on PATH, not here
        update["command"] = next_to(command, base_dir, listing)
    if base_dir is not None:
        if spec.cwd is None:
            update["args"] = [next_to(arg, base_dir, listing) for arg in spec.args]
        else:
            update["cwd"] = next_to(spec.cwd, base_dir, listing)
    return spec.model_copy(update=update)


def next_to(value: str, base_dir: Path, listing: frozenset[str]) -> str:
    """`value` made absolute under the manifest's directory when it is a relative path that exists there.

    `listing` is the directory's entries, read once per manifest: a value whose first component is not one
    of them cannot exist there, so most arguments (module names, numbers, flags) cost no stat.
    """
    if not value or value.startswith(("-", "~", "$")) or os.path.isabs(value) or "://" in value:
        return value
    head = value.split("/", 1)[0]
    if head not in listing and head not in (".", ".."):
        return value
    candidate = base_dir / value
    return str(candidate) if candidate.exists() else value


def listing_of(base_dir: Path | None) -> frozenset[str]:
    try:
        return frozenset(os.listdir(base_dir)) if base_dir is not None else frozenset()
    except OSError:
        return frozenset()


def git_root(path: Path) -> Path | None:
    """The git repository holding `path` (added to its stdio servers' PYTHONPATH), if any."""
    for parent in path.resolve().parents:
        if (parent / ".git").exists():
            return parent
    return None
