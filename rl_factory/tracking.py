"""Experiment tracking: one `Tracker.log(metrics, step)` fanned out to the configured backends.

Backends live in the `LOGGERS` registry (`console`, `jsonl`, `tensorboard`, `wandb`; add one
with `@register_logger`). Each gets its own options slice: `Tracker(..., options={"console":
{"every": 10}, "wandb": {"project": "calc"}})`.

Resuming never duplicates a step: `jsonl` rewrites `metrics.jsonl` without the lines whose step
is >= the resume step (they belong to the part of the killed run after its last checkpoint),
`tensorboard` passes the resume step as `purge_step`, and `wandb` reattaches to the run id it
saved in the run directory.
"""
from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path
from typing import Any

from rl_factory.base.errors import UserError
from rl_factory.base.files import write_atomic
from rl_factory.jsonl import read_lines
from rl_factory.base.registry import Registry

METRICS_FILE = "metrics.jsonl"
# Keys that measure wall-clock time or how the engine happened to schedule work: they differ between
# two runs of the same seed and config. Every other metric is reproducible on CPU (the embedded
# engine samples from per-trajectory seeded streams with batch-invariant numerics; see engines/hf.py).
#   timing/*          seconds spent per phase
#   tool/latency_s/*  measured tool-call latency
#   engine/*          busy seconds, tokens/s, and rows per decode step (which depends on when tool
#                     results came back, not on what was generated)
WALL_CLOCK_PREFIXES = ("timing/", "tool/latency_s/", "engine/")


def reproducible_metrics(metrics: dict[str, Any]) -> dict[str, Any]:
    """`metrics` without the wall-clock keys: what two runs of the same seed and config share."""
    return {k: v for k, v in metrics.items() if not k.startswith(WALL_CLOCK_PREFIXES)}


class TrackingError(UserError, ValueError):
    """A logger name is unknown or a logger backend cannot start."""


class LoggerBackend:
    """One destination for metrics. Subclasses take keyword options from the tracker config."""

    requires: str | None = None  # the package it needs (an extra of rl_factory), checked up front

    def __init__(self, run_dir: Path, config: dict[str, Any] | None, resume_step: int | None):
        self.run_dir, self.config, self.resume_step = run_dir, config, resume_step

    def log(self, metrics: dict[str, Any], step: int) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass


LOGGERS: Registry[type[LoggerBackend]] = Registry("logger")
register_logger = LOGGERS.register  # class decorator; a taken name is an error


@register_logger("console")
class ConsoleLogger(LoggerBackend):
    """Prints `step N | key value | ...` every `every` steps; 0 (default) never, since the trainer
    shows a progress bar."""

    def __init__(self, run_dir, config, resume_step, every: int = 0, keys: list[str] | None = None):
        super().__init__(run_dir, config, resume_step)
        self.every, self.keys = every, keys

    def log(self, metrics: dict[str, Any], step: int) -> None:
        if not self.every or step % self.every:
            return
        keys = self.keys if self.keys is not None else sorted(metrics)
        parts = [f"{k} {_fmt(metrics[k])}" for k in keys if k in metrics]
        print(" | ".join([f"step {step}", *parts]), flush=True)


@register_logger("jsonl")
class JsonlLogger(LoggerBackend):
    """Appends `{"step": N, **metrics}` to run_dir/metrics.jsonl, flushed per line so a crash loses
    at most the line being written. Non-finite floats are written as null (strict JSON)."""

    def __init__(self, run_dir, config, resume_step, filename: str = METRICS_FILE):
        super().__init__(run_dir, config, resume_step)
        self.path = run_dir / filename
        if resume_step is not None and self.path.exists():
            truncate_metrics(self.path, resume_step)
        self._file = self.path.open("a", encoding="utf-8")

    def log(self, metrics: dict[str, Any], step: int) -> None:
        record = {"step": step, **{k: _json_value(v) for k, v in metrics.items() if k != "step"}}
        self._file.write(json.dumps(record, default=str) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def truncate_metrics(path: Path, resume_step: int) -> int:
    """Rewrite a metrics.jsonl keeping only the lines with step < resume_step.

    A torn last line (the run was killed mid-write) is dropped too. The rewrite goes through a
    temporary file and `os.replace`, so a crash here leaves the old file intact.

    Returns:
        The number of lines dropped.
    """
    kept, dropped = [], 0
    for line in read_lines(path):
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            dropped += 1
            continue
        if isinstance(record, dict) and isinstance(record.get("step"), int) \
                and record["step"] >= resume_step:
            dropped += 1
            continue
        kept.append(line + "\n")
    write_atomic(path, "".join(kept))
    return dropped


@register_logger("tensorboard")
class TensorboardLogger(LoggerBackend):
    """Scalars to run_dir/tensorboard; non-numeric metrics are skipped."""

    requires = "tensorboard"

    def __init__(self, run_dir, config, resume_step, log_dir: str = "tensorboard"):
        super().__init__(run_dir, config, resume_step)
        try:
            from torch.utils.tensorboard import SummaryWriter  # slow import; only when used
        except ImportError as exc:  # torch's writer needs the tensorboard package
            raise TrackingError(f"logger 'tensorboard' needs the tensorboard package: {_install_hint('tensorboard')}, "
                                "or remove it from trainer.logger") from exc

        self.writer = SummaryWriter(str(run_dir / log_dir), purge_step=resume_step)
        if config is not None and resume_step is None:
            text = json.dumps(config, indent=2, default=str)
            self.writer.add_text("config", f"```\n{text}\n```", 0)

    def log(self, metrics: dict[str, Any], step: int) -> None:
        for key, value in metrics.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


@register_logger("wandb")
class WandbLogger(LoggerBackend):
    """Weights & Biases, offline unless WANDB_API_KEY is set (or `mode` is given).

    The run id is kept in run_dir/wandb_run_id so a resumed training run continues the same
    wandb run instead of starting a second one.
    """

    requires = "wandb"

    def __init__(self, run_dir, config, resume_step, project: str = "rl_factory",
                 name: str | None = None, mode: str | None = None, **init_kwargs: Any):
        super().__init__(run_dir, config, resume_step)
        try:
            import wandb
        except ImportError as exc:
            raise TrackingError(f"logger 'wandb' needs the wandb package: {_install_hint('wandb')}, "
                                "or remove it from trainer.logger") from exc
        id_file = run_dir / "wandb_run_id"
        if resume_step is not None and id_file.exists():
            run_id = id_file.read_text().strip()
        else:
            run_id = wandb.util.generate_id()
            id_file.write_text(run_id)
        self._wandb = wandb
        self.run = wandb.init(
            project=project, name=name or run_dir.name, id=run_id, resume="allow",
            dir=str(run_dir), config=config,
            mode=mode or ("online" if os.environ.get("WANDB_API_KEY") else "offline"),
            **init_kwargs,
        )

    def log(self, metrics: dict[str, Any], step: int) -> None:
        self.run.log(metrics, step=step)

    def close(self) -> None:
        self.run.finish()


def check_loggers(loggers: list[str]) -> list[str]:
    """The logger names, deduplicated; raises TrackingError for an unknown one or a missing package.

    Cheap (no import of the packages): the trainer calls it before writing into the run directory.
    """
    names = list(dict.fromkeys(loggers))  # dedupe, keep order
    unknown = [n for n in names if n not in LOGGERS]
    if unknown:
        raise TrackingError(f"unknown logger(s) {unknown}; valid: {sorted(LOGGERS)}")
    for name in names:
        package = LOGGERS[name].requires
        if package is not None and not _importable(package):
            raise TrackingError(f"logger {name!r} needs the {package} package: {_install_hint(package)}, "
                                "or remove it from trainer.logger")
    return names


def _importable(package: str) -> bool:
    import importlib.util

    if package in sys.modules:  # already imported (or set to None: blocked)
        return sys.modules[package] is not None
    try:
        return importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):  # a package set to None in sys.modules, or a broken install
        return False


class Tracker:
    """Sends each step's metrics to every configured backend.

    Args:
        run_dir: the run directory (created if missing).
        loggers: backend names from `LOGGERS`, e.g. ["console", "jsonl"].
        config: the resolved run config (secrets already redacted), for backends that store it.
        resume_step: the first step the resumed run will log; None for a fresh run.
        options: per-backend keyword options, keyed by logger name.
    """

    def __init__(self, run_dir: str | Path, loggers: list[str],
                 config: dict[str, Any] | None = None, resume_step: int | None = None,
                 options: dict[str, dict[str, Any]] | None = None):
        names = check_loggers(loggers)
        options = options or {}
        stray = sorted(set(options) - set(names))
        if stray:
            raise TrackingError(f"options given for logger(s) {stray} that are not in {names}")
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.backends: dict[str, LoggerBackend] = {}
        try:
            for name in names:
                self.backends[name] = LOGGERS[name](self.run_dir, config, resume_step,
                                                    **options.get(name, {}))
        except BaseException:
            self.close()  # do not leak the backends that did start
            raise

    def log(self, metrics: dict[str, Any], step: int) -> None:
        """Log one step; nested dicts flatten to "a/b", tensors and numpy scalars to numbers."""
        flat = flatten_metrics(metrics)
        for backend in self.backends.values():
            backend.log(flat, int(step))

    def close(self) -> None:
        while self.backends:
            _, backend = self.backends.popitem()
            backend.close()

    def __enter__(self) -> Tracker:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def flatten_metrics(metrics: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": t}} -> {"a/b": float(t)}; 1-element tensors and numpy scalars become numbers."""
    flat: dict[str, Any] = {}
    for key, value in metrics.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten_metrics(value, prefix=f"{name}/"))
            continue
        flat[name] = _unwrap(value)
    return flat


def _unwrap(value: Any) -> Any:
    if hasattr(value, "numel") and callable(value.numel):  # torch tensor
        return value.item() if value.numel() == 1 else value.tolist()
    if hasattr(value, "item") and getattr(value, "size", None) == 1:  # numpy scalar or 1-array
        return value.item()
    return value


def json_safe(value: Any) -> Any:
    """A copy with NaN and infinities (not JSON) as null, as metrics.jsonl writes them; dicts and lists deep."""
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return _json_value(value)


def _json_value(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _install_hint(extra: str) -> str:
    """The command that installs extra `extra` into the interpreter running this (a checkout or a wheel)."""
    root = Path(__file__).resolve().parent.parent
    target = f"'{root}[{extra}]'" if (root / "pyproject.toml").exists() else f"'rl_factory[{extra}]'"
    return f"`{sys.executable} -m pip install {'-e ' if root.joinpath('pyproject.toml').exists() else ''}{target}`"


def _fmt(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)
