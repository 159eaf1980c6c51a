"""The files a run reads while it trains, and their fingerprints: the reward's source files and the datasets.

A reward spec is `path/file.py:fn` or `package.module:fn`; a module's file is found without importing it.
Reward files are small and hashed whole; dataset files may be large, so theirs is size and modification
time (a rewrite changes at least one).
"""
from __future__ import annotations

import hashlib
import importlib.util
from collections.abc import Mapping
from pathlib import Path
from typing import Any


def reward_specs(reward: Mapping[str, Any]) -> list[str]:
    """Every function spec of the `reward.*` slice: `function`, each of `functions`, the process reward's."""
    specs = [reward.get("function")]
    specs += [entry.get("function") for entry in reward.get("functions") or [] if isinstance(entry, Mapping)]
    specs.append((reward.get("process") or {}).get("function"))
    return [s for s in specs if isinstance(s, str) and s]


def spec_file(spec: str) -> Path | None:
    """The source file of a reward spec, or None (a builtin, an unknown module)."""
    target = spec.rsplit(":", 1)[0]
    if target.endswith(".py") or "/" in target:
        path = Path(target)
        return path if path.is_file() else None
    try:
        found = importlib.util.find_spec(target)
    except (ImportError, ValueError):
        return None
    return Path(found.origin) if found is not None and found.origin and found.origin.endswith(".py") else None


def watched_files(config: Mapping[str, Any]) -> dict[str, str]:
    """path -> kind ("reward" or "data") for a resolved config."""
    files: dict[str, str] = {}
    for spec in reward_specs(config.get("reward") or {}):
        path = spec_file(spec)
        if path is not None:
            files[str(path.resolve())] = "reward"
    data = config.get("data") or {}
    for key in ("train_files", "val_files"):
        value = data.get(key)
        for item in [value] if isinstance(value, str) else list(value or []):
            if isinstance(item, str) and Path(item).is_file():
                files.setdefault(str(Path(item).resolve()), "data")
    return files


def fingerprint_file(path: str, kind: str) -> str:
    p = Path(path)
    try:
        stat = p.stat()
    except OSError:
        return "missing"
    if kind == "reward":
        return hashlib.sha256(p.read_bytes()).hexdigest()[:16]
    return f"{stat.st_size}:{stat.st_mtime_ns}"


class FileWatch:
    """Fingerprints of the watched files; a reward file is re-hashed only when its size or time changed."""

    def __init__(self, files: dict[str, str]):
        self.files = files
        self._stat: dict[str, tuple[int, int] | None] = {}
        self._prints: dict[str, str] = {}

    def fingerprints(self) -> dict[str, str]:
        for path, kind in self.files.items():
            try:
                st = Path(path).stat()
                key = (st.st_size, st.st_mtime_ns)
            except OSError:
                key = None
            if path not in self._prints or self._stat.get(path) != key:
                self._stat[path], self._prints[path] = key, fingerprint_file(path, kind)
        return dict(self._prints)
