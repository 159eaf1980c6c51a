"""Relative paths on the command line resolve against the caller's working directory.

main_grpo.sh and main_eval.sh change into the project directory (so the config's own defaults, such
as `examples/calculator/data/train.jsonl` and `outputs/<experiment_name>`, are the project's) and
export the directory they were started from as `RL_FACTORY_CALLER_CWD`. `caller_paths` rewrites
the overrides that name files (`PATH_KEYS`) to absolute paths under it, before the config is composed,
so `bash ~/rl_factory/main_grpo.sh env.tools=tools.yaml` from a task's directory reads that task's
`tools.yaml`. A relative path that exists only under the project directory (the way the examples'
commands are written) is left as it is, and so is everything that is not a file: a hub id, an inline
manifest, `builtin:` models, `package.module:fn` specs, interpolations. Paths inside a manifest are
the manifest's business (envs.manifest: relative to the manifest's directory).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

CALLER_CWD_ENV = "RL_FACTORY_CALLER_CWD"


def _file(value: str, caller: Path, here: Path) -> str:
    """A relative file path under `caller`, unless only `here` (the project directory) has it."""
    if not value or _not_a_path(value) or os.path.isabs(value):
        return value
    mine = caller / value
    if not mine.exists() and (here / value).exists():
        return value
    return str(mine)


def _not_a_path(value: str) -> bool:
    # quoted values, interpolations, mappings and URLs are the config's to parse
    return value.startswith(("~", "$", "{", "'", '"', "builtin:")) or "://" in value or value in ("null", "None")


def _local_model(value: str, caller: Path, here: Path) -> str:
    """model.path: a directory under the caller; a hub id (`org/name`) that is no directory stays."""
    explicit = value.startswith(("./", "../"))
    return _file(value, caller, here) if explicit or (caller / value).is_dir() else value


def _spec(value: str, caller: Path, here: Path) -> str:
    """`file.py:fn` with its file part resolved; `package.module:fn` as is."""
    file, sep, name = value.rpartition(":")
    if not sep or not file.endswith(".py"):
        return value
    return f"{_file(file, caller, here)}:{name}"


def _resume(value: str, caller: Path, here: Path) -> str:
    return value if value in ("auto", "never", "force") else _file(value, caller, here)


def _list_or_one(resolve: Callable[[str, Path, Path], str]) -> Callable[[str, Path, Path], str]:
    """`[a.jsonl,b.jsonl]` item by item (a plain list of names), else one value."""
    def each(value: str, caller: Path, here: Path) -> str:
        inner = value[1:-1] if value.startswith("[") and value.endswith("]") else None
        if inner is None:
            return resolve(value, caller, here)
        if any(c in inner for c in "[]{}'\"$"):
            return value  # not a plain list of paths: left for the config to parse
        items = [item.strip() for item in inner.split(",") if item.strip()]
        return "[" + ",".join(resolve(item, caller, here) for item in items) + "]"
    return each


# key -> how its value is resolved
PATH_KEYS: dict[str, Callable[[str, Path, Path], str]] = {
    "data.train_files": _list_or_one(_file),
    "data.val_files": _list_or_one(_file),
    "eval.files": _list_or_one(_file),
    "env.tools": _file,
    "env.environment": _spec,
    "reward.function": _spec,
    "model.path": _local_model,
    "trainer.output_dir": _file,
    "trainer.resume": _resume,
    "eval.output_dir": _file,
    "eval.compare": _file,
}


def caller_paths(overrides: list[str], project_dir: Path | None = None) -> list[str]:
    """`overrides` with the relative paths of `PATH_KEYS` made absolute under the caller's directory."""
    caller = os.environ.get(CALLER_CWD_ENV)
    here = (project_dir or Path.cwd()).resolve()
    if not caller or Path(caller).resolve() == here:
        return overrides  # started from the project directory: relative paths already mean the same
    caller_dir = Path(caller).resolve()
    out = []
    for override in overrides:
        key, sep, value = override.partition("=")
        resolve = PATH_KEYS.get(key.lstrip("+"))
        out.append(f"{key}={resolve(value, caller_dir, here)}" if sep and resolve else override)
    return out
