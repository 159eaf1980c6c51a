"""What makes two configs "the same run": the fingerprint a run directory records, and the diff.

A run directory belongs to one run. `run.json` records its run id and the fingerprint of the config
that made it: the resolved config (secrets redacted) without the keys a resumed run may change
(`RESUMABLE_KEYS`: how long to train, how often to save, where to log, which device; the run guard's
settings), plus the
content hash of the tool manifest file, since the tools' schemas shape the prompt (and the vocabulary
of the built-in model). A different fingerprint never resumes into the directory; `describe_diff`
says in a few words what differs.
"""
from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

# Keys a resumed run may change without being another run: the length of training, bookkeeping,
# and where things run. Anything else (data, model, tools, reward, algorithm, optimizer) is the run.
RESUMABLE_KEYS = frozenset({
    "experiment_name", "trainer.total_steps", "trainer.output_dir", "trainer.eval_every", "trainer.save_every",
    "trainer.keep_checkpoints", "trainer.logger", "trainer.resume", "trainer.save_rollouts", "trainer.progress",
    "trainer.report", "model.device", "model.num_threads", "reward.max_concurrency", "reward.executor",
    "rollout.max_batch_size", "rollout.engine_threads", "data.val_limit",
})
# ... and every key under these: the run guard watches the run, it does not change what is trained
RESUMABLE_PREFIXES = ("trainer.guard.",)
MANIFEST_KEY = "env.tools#sha256"  # the manifest file's content, next to its path


def flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": 1}} -> {"a.b": 1}; lists stay values."""
    if not isinstance(data, Mapping) or (prefix and not data):
        return {prefix: data} if prefix else {}
    out: dict[str, Any] = {}
    for key, value in data.items():
        out.update(flatten(value, f"{prefix}.{key}" if prefix else str(key)))
    return out


def run_view(config: Mapping[str, Any], base_dir: Path | None = None) -> dict[str, Any]:
    """The part of a (redacted, resolved) config that identifies a run, flattened to dotted keys."""
    view = {k: v for k, v in flatten(config).items() if k not in RESUMABLE_KEYS and not k.startswith(RESUMABLE_PREFIXES)}
    tools = view.get("env.tools")
    if isinstance(tools, str) and tools:
        path = Path(tools) if base_dir is None or Path(tools).is_absolute() else base_dir / tools
        if path.is_file():
            view[MANIFEST_KEY] = hashlib.sha256(path.read_bytes()).hexdigest()
    return view


def fingerprint(view: Mapping[str, Any]) -> str:
    blob = json.dumps(view, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def describe_diff(old: Mapping[str, Any], new: Mapping[str, Any], limit: int = 3) -> str:
    """`rollout.n 8 -> 4, env.tools (file contents changed) [+2 more]`: the first `limit` differences."""
    keys = sorted(set(old) | set(new), key=lambda k: (k == MANIFEST_KEY, k))
    parts = []
    for key in keys:
        if old.get(key, _MISSING) == new.get(key, _MISSING):
            continue
        if key == MANIFEST_KEY:
            if key in old and key in new:  # a manifest path alone (legacy run) is not a difference
                parts.append("env.tools (the manifest file's contents changed)")
            continue
        parts.append(f"{key} {_short(old.get(key, _MISSING))} -> {_short(new.get(key, _MISSING))}")
    shown = ", ".join(parts[:limit])
    return shown + (f" [+{len(parts) - limit} more]" if len(parts) > limit else "")


class _Missing:
    def __repr__(self) -> str:
        return "(unset)"


_MISSING = _Missing()


def _short(value: Any, width: int = 40) -> str:
    text = repr(value) if isinstance(value, _Missing) else json.dumps(value, default=str)
    text = text.strip('"') if isinstance(value, str) else text
    return text if len(text) <= width else text[: width - 3] + "..."
