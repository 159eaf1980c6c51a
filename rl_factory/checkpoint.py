"""Checkpoints that survive a crash mid-save, and the state a resumed run needs.

A checkpoint is `checkpoints/step_NNNNNN/`: the model and tokenizer in Hugging Face format (so
`AutoModelForCausalLM.from_pretrained` loads it directly) plus `trainer_state.pt` (optimizer,
scheduler, data sampler position, RNG states, step) and `guard_state.json` (what the run guard's
checks learned, rl_factory/guard/state.py). It is written into a hidden temporary
directory and renamed into place, so a run killed while saving leaves the previous checkpoint
intact and never a half-written one that resume would pick up. Re-saving a step that exists (after
a resume) first renames the old directory away (`.old-step_NNNNNN`), renames the new one in, and
only then deletes the old one; a crash between the two renames leaves the old one to be renamed
back by `latest_checkpoint`.
"""
from __future__ import annotations

import os
import random
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

STEP_DIR = re.compile(r"^step_(\d{6,})$")
STATE_FILE = "trainer_state.pt"
OLD_PREFIX = ".old-"


def checkpoint_dir(run_dir: Path, step: int) -> Path:
    return run_dir / "checkpoints" / f"step_{step:06d}"


def checkpoint_step(path: Path) -> int:
    """The step a checkpoint directory holds (from its name, else its trainer state)."""
    match = STEP_DIR.match(Path(path).name)
    return int(match.group(1)) if match else int(load_trainer_state(Path(path))["step"])


def latest_checkpoint(run_dir: Path) -> Path | None:
    root = run_dir / "checkpoints"
    if not root.is_dir():
        return None
    for old in root.glob(f"{OLD_PREFIX}step_*"):  # a re-save that died between its two renames
        final = root / old.name.removeprefix(OLD_PREFIX)
        if not final.exists() and (old / STATE_FILE).exists():
            os.replace(old, final)
    done = [p for p in root.iterdir() if STEP_DIR.match(p.name) and (p / STATE_FILE).exists()]
    return max(done, key=lambda p: int(STEP_DIR.match(p.name).group(1)), default=None)


def rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(run_dir: Path, step: int, model, tokenizer, trainer_state: dict[str, Any],
                    keep: int = 0, extra: dict[str, Any] | None = None) -> Path:
    """Write checkpoint `step` atomically, then prune to the newest `keep` (0 keeps all).

    `extra` maps file names to objects saved next to trainer_state.pt: `torch.save`d (e.g. value_head.pt), or
    written as JSON when the name ends in `.json` (the run guard's guard_state.json, rl_factory/guard/state.py).
    """
    final = checkpoint_dir(run_dir, step)
    tmp = final.parent / f".tmp-{final.name}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    model.save_pretrained(tmp)  # a peft model writes its adapter only (rl_factory/lora.py)
    tokenizer.save_pretrained(tmp)
    torch.save({**trainer_state, "step": step, "rng": rng_state()}, tmp / STATE_FILE)
    for name, obj in (extra or {}).items():
        if name.endswith(".json"):
            from rl_factory.guard.state import to_json

            (tmp / name).write_text(to_json(obj), encoding="utf-8")
        else:
            torch.save(obj, tmp / name)
    _fsync_dir(tmp)
    old = final.parent / f"{OLD_PREFIX}{final.name}"
    if final.exists():  # re-saving a step after resume: move the old one away, never delete it first
        shutil.rmtree(old, ignore_errors=True)
        os.replace(final, old)
    os.replace(tmp, final)
    _fsync_dir(final.parent)
    shutil.rmtree(old, ignore_errors=True)
    if keep > 0:
        # Prune by step number among complete checkpoints, never touching the one just written
        # (a run resumed from an older checkpoint may find newer ones in the directory).
        done = sorted((p for p in final.parent.iterdir() if STEP_DIR.match(p.name) and p != final
                       and (p / STATE_FILE).exists()), key=lambda p: int(STEP_DIR.match(p.name).group(1)))
        for old in done[: max(0, len(done) - (keep - 1))]:
            shutil.rmtree(old, ignore_errors=True)
    return final


def load_trainer_state(path: Path) -> dict[str, Any]:
    return torch.load(path / STATE_FILE, map_location="cpu", weights_only=False)


def _fsync_dir(path: Path) -> None:
    for file in [path] + [p for p in path.iterdir() if p.is_file()] if path.is_dir() else [path]:
        try:
            fd = os.open(file, os.O_RDONLY)
        except OSError:
            continue
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
