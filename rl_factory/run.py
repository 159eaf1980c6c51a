"""The run directory, console progress and the closing summary.

Layout (DESIGN §5): run.json, config.yaml, metrics.jsonl, rollouts/, checkpoints/step_NNNNNN/, train.log,
tool_logs/. Nothing is written before the run has passed its start-up checks (`RunDir.start`): what
is logged before goes to the console and is written to train.log when the run starts, and the tool
servers' logs stay in anonymous files until then (`ToolEnv.log_to`).
"""
from __future__ import annotations

import collections
import json
import logging
import math
import sys
import time
import uuid
import warnings
from pathlib import Path
from typing import Any

import yaml

from rl_factory import checkpoint as ckpt
from rl_factory.config import ConfigError, redacted
from rl_factory.fingerprint import describe_diff, fingerprint, run_view
from rl_factory.base.files import write_atomic

log = logging.getLogger("rl_factory")
RUN_FILE = "run.json"
# auto: continue this run if the directory holds it | never: a new run (in a fresh directory if this one
# holds another) | force: continue the directory's run even with a changed config | or a checkpoint dir.
RESUME_MODES = ("auto", "never", "force")


class RunDir:
    """Owns `trainer.output_dir`: which run it belongs to, resume points, config.yaml and train.log.

    Reading comes first and writes nothing: `resume_point` checks the directory's `run.json` (run id
    and config fingerprint, rl_factory/fingerprint.py) against this config and finds the checkpoint
    to continue from. `start` is the first write, called once the config has passed its checks.
    """

    def __init__(self, path: Path):
        self.path = path
        self.config: dict = {}
        self.run_id = uuid.uuid4().hex[:12]
        self.finished_step: int | None = None  # set when the checkpoint is at or past total_steps
        self.t0 = time.time()
        self._view: dict = {}
        self._forced_diff = ""
        self._notes: list[str] = []  # said once logging goes to this run's train.log

    def resume_point(self, cfg, resume: str, total_steps: int | None = None) -> Path | None:
        """The checkpoint to resume from (None: a fresh run), after checking the directory is this run's.

        Raises:
            ConfigError: the directory holds another run (one line: what differs, and the choices), or
                `resume` names no checkpoint.
        """
        resume = _mode(resume)
        if resume not in RESUME_MODES and not (Path(resume) / ckpt.STATE_FILE).exists():
            raise ConfigError(f"trainer.resume: {resume} is neither one of {', '.join(RESUME_MODES)} nor a "
                              f"checkpoint directory (no {ckpt.STATE_FILE})")
        self.claim(cfg, resume)
        if resume == "never":
            return None
        point = ckpt.latest_checkpoint(self.path) if resume in ("auto", "force") else Path(resume)
        if point is not None and total_steps is not None and ckpt.checkpoint_step(point) >= total_steps:
            self.finished_step = ckpt.checkpoint_step(point)
        return point

    def claim(self, cfg, resume: str) -> Path:
        """Check that the directory is this run's (both backends; reads only); returns the run's directory.

        A directory holding another run's results refuses `auto` and a checkpoint path (one line: what
        differs, and the choices); `force` continues it with the changed config; `never` moves this run to
        a fresh sibling (`self.path` changes). `start` or `record` later writes `run.json`.

        Raises:
            ConfigError: the directory holds a run of another config.
        """
        resume = _mode(resume)
        self.config = redacted(cfg)
        self._view = run_view(self.config)
        previous = self._previous_run()
        if previous is not None and resume == "never":
            self.path = _fresh_sibling(self.path)  # a new run never overwrites one that has results
            self._notes.append(f"trainer.resume=never: {previous['dir']} holds a run; starting in {self.path}")
            previous = None
        if previous is not None:
            diff = describe_diff(previous["view"], self._view)
            if diff and resume != "force":
                raise ConfigError(self._refusal(previous, diff))
            self.run_id, self._forced_diff = previous["run_id"] or self.run_id, diff
        return self.path

    def _previous_run(self) -> dict | None:
        """The run this directory holds, if it has results (a checkpoint or logged steps) to protect."""
        if not _has_results(self.path):
            return None
        record = _read_json(self.path / RUN_FILE)
        if record is None:  # a directory written before run.json existed: its config.yaml says enough
            config = self.path / "config.yaml"
            old = yaml.safe_load(config.read_text()) if config.exists() else None
            if not isinstance(old, dict):
                return None
            old = old.get("rl_factory", old)  # a verl run's config.yaml holds ours under `rl_factory`
            record = {"run_id": None, "view": run_view(old)}
        latest = ckpt.latest_checkpoint(self.path)
        return {"dir": self.path, "run_id": record.get("run_id"), "view": record.get("view", {}),
                "step": ckpt.checkpoint_step(latest) if latest else None}

    def _refusal(self, previous: dict, diff: str) -> str:
        what = f"run {previous['run_id']}" if previous["run_id"] else "a run"
        at = f", checkpoint at step {previous['step']}" if previous["step"] else ""
        return (f"{self.path} holds {what}{at} with another config ({diff}); to keep it, pick a new "
                f"experiment_name=... or trainer.resume=never (starts in {_fresh_sibling(self.path)}); to "
                f"continue it with these settings, trainer.resume=force")

    def nothing_to_do(self, total_steps: int) -> dict[str, Any]:
        """The closing line of a run whose checkpoint already reached `trainer.total_steps`."""
        step = self.finished_step
        past = "finished" if step == total_steps else f"past trainer.total_steps={total_steps}: it finished"
        log.info("nothing to train: the run in %s is %s at step %d; raise trainer.total_steps above %d to "
                 "train further (the report is %s)", self.path, past, step, step, self.path / "report.html")
        return {"steps": step, "run_dir": str(self.path), "nothing_to_do": True}

    def start(self, cfg, resumed: bool, tools=None) -> None:
        """The first write into the run directory: run.json, config.yaml, train.log and, given the
        run's `ToolEnv`, its servers' logs in tool_logs/. Called once every start-up check has passed."""
        self.path.mkdir(parents=True, exist_ok=True)
        setup_logging(self.path / "train.log")  # with what was logged before
        self.config = write_config(self.path, cfg)
        self._write_record()
        if tools is not None:
            tools.log_to(self.path / "tool_logs")
        for note in self._notes:
            log.info(note)
        log.info("%s run in %s (run id %s)", "resuming" if resumed else "starting", self.path, self.run_id)
        if self._forced_diff:
            log.warning("trainer.resume=force: continuing with a changed config (%s)", self._forced_diff)

    def record(self) -> None:
        """`run.json` alone, for the config `claim` checked: the verl launcher's first write (verl writes the rest)."""
        self.path.mkdir(parents=True, exist_ok=True)
        self._write_record()
        for note in self._notes:
            log.info(note)
        if self._forced_diff:
            log.warning("trainer.resume=force: continuing with a changed config (%s)", self._forced_diff)

    def _write_record(self) -> None:
        view = self._view or run_view(self.config)
        record = {"run_id": self.run_id, "fingerprint": fingerprint(view), "view": view}
        write_atomic(self.path / RUN_FILE, json.dumps(record, indent=1, default=str))

    def write_report(self, enabled: bool = True) -> None:
        """(Re)write report.html; a report that fails is a warning, never the end of a run."""
        if not enabled:
            return
        try:
            from rl_factory.report import write_report
            write_report(self.path)
        except Exception as exc:  # the report is a view of the run, not part of it
            log.warning("report.html not written: %s: %s", type(exc).__name__, exc)

    def finish(self, history: dict[str, Any], step: int) -> dict[str, Any]:
        first, last = history.get("first_val", {}), history.get("last_val", {})
        summary = {
            "steps": step,
            "minutes": (time.time() - self.t0) / 60,
            "run_dir": str(self.path),
            "checkpoint": str(ckpt.latest_checkpoint(self.path) or ""),
            "val_accuracy_before": first.get("val/accuracy"),
            "val_accuracy_after": last.get("val/accuracy"),
            "val_tool_call_rate_before": first.get("val/tool/call_rate"),
            "val_tool_call_rate_after": last.get("val/tool/call_rate"),
        }
        lines = [
            f"done: {step} steps in {summary['minutes']:.1f} min",
            f"  val accuracy:       {_f(summary['val_accuracy_before'])} -> {_f(summary['val_accuracy_after'])}",
            f"  val tool-call rate: {_f(summary['val_tool_call_rate_before'])} -> "
            f"{_f(summary['val_tool_call_rate_after'])}",
            f"  run directory:      {self.path}  (report.html, metrics.jsonl, rollouts/, train.log)",
            f"  last checkpoint:    {summary['checkpoint']}",
        ]
        for line in lines:
            log.info(line)
        return summary


def write_config(directory: Path, cfg) -> dict:
    """`<directory>/config.yaml`: the resolved config, secrets redacted (run and eval directories)."""
    config = redacted(cfg)
    write_atomic(directory / "config.yaml", yaml.safe_dump(config, sort_keys=False))
    return config


def _mode(resume: Any) -> str:
    """`trainer.resume` as a string; false / None spell `never`."""
    return "never" if str(resume) in ("false", "False", "None") else str(resume)


def _has_results(path: Path) -> bool:
    metrics = path / "metrics.jsonl"
    return ckpt.latest_checkpoint(path) is not None or (metrics.is_file() and metrics.stat().st_size > 0)


def _fresh_sibling(path: Path) -> Path:
    """`outputs/x-2`, `outputs/x-3`, ...: the first that holds no run."""
    n = 2
    while _has_results(path.with_name(f"{path.name}-{n}")):
        n += 1
    return path.with_name(f"{path.name}-{n}")


def _read_json(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _f(value: Any) -> str:
    return "n/a" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.2f}"


class _TqdmHandler(logging.StreamHandler):
    """Console log lines that don't tear the progress bar."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            from tqdm import tqdm
            tqdm.write(self.format(record), file=sys.stderr)
        except Exception:  # logging must never take the run down
            self.handleError(record)


class _Pending(logging.Handler):
    """Holds what is logged before a run directory may be written, for its train.log (the last
    `MAX_PENDING` records: a process that never starts a run, such as an evaluation, keeps no more)."""

    MAX_PENDING = 10_000

    def __init__(self):
        super().__init__()
        self.records: collections.deque[logging.LogRecord] = collections.deque(maxlen=self.MAX_PENDING)

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


class _Once(logging.Filter):
    """Lets each warning's text through once: a warning said per file or per component (train and val rows,
    the policy and its reference) is said once on the console; train.log keeps every one."""

    def __init__(self):
        super().__init__()
        self.seen: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno != logging.WARNING:
            return True
        text = record.getMessage()
        if text in self.seen:
            return False
        self.seen.add(text)
        return True


# Where third-party deprecation warnings go: train.log only (a user can do nothing about a library's
# FutureWarning, such as transformers' on past_key_values; it would be repeated on every run's console).
QUIET = logging.getLogger("rl_factory.quiet")
DEPRECATIONS = (DeprecationWarning, PendingDeprecationWarning, FutureWarning)
_OURS = tuple(str(Path(__file__).resolve().parents[1] / pkg) for pkg in ("rl_factory", "envs", "rewards", "examples"))


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    if issubclass(category, DEPRECATIONS) and not str(Path(filename).resolve()).startswith(_OURS):
        QUIET.warning("%s:%s: %s: %s", filename, lineno, category.__name__, message)
        return
    _shown_before(message, category, filename, lineno, file, line)


_shown_before = warnings.showwarning  # what showed warnings before setup_logging (Python's own, or a test's)


def setup_logging(log_file: Path | None = None, level: int = logging.INFO) -> None:
    """Console logging, plus `log_file` (train.log) with every record logged since the last call without one.

    Each warning is printed on the console once; third-party deprecation warnings go to train.log only.
    """
    global _shown_before
    root = logging.getLogger("rl_factory")
    root.setLevel(level)
    root.propagate = False
    QUIET.propagate = False
    QUIET.setLevel(level)
    pending = sorted((r for logger in (root, QUIET) for h in logger.handlers if isinstance(h, _Pending)
                      for r in h.records), key=lambda r: r.created)
    # a run's warnings are said once: the call that adds its train.log keeps what the run's first call saw
    kept = next((f for h in root.handlers for f in h.filters if isinstance(f, _Once)), None)
    once = kept if kept is not None and log_file is not None else _Once()
    for logger in (root, QUIET):
        for handler in list(logger.handlers):
            logger.removeHandler(handler)
            handler.close()
    if warnings.showwarning is not _show_warning:
        _shown_before, warnings.showwarning = warnings.showwarning, _show_warning
    console = _TqdmHandler()
    console.setFormatter(logging.Formatter("%(message)s"))
    console.addFilter(once)
    root.addHandler(console)
    if log_file is None:
        root.addHandler(_Pending())
        QUIET.addHandler(_Pending())
        return
    file = logging.FileHandler(log_file, encoding="utf-8")
    file.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    for record in pending:
        file.handle(record)
    root.addHandler(file)
    QUIET.addHandler(file)


class StepProgress:
    """A tqdm bar over training steps showing reward, accuracy and step time.

    Without a terminal (CI, logs piped to a file) it logs one compact line per step instead.
    """

    def __init__(self, total: int, start: int = 0, enabled: bool = True):
        self.bar = None
        if enabled and sys.stderr.isatty():
            from tqdm import tqdm
            self.bar = tqdm(total=total, initial=start, desc="train", unit="step", dynamic_ncols=True)

    def update(self, step: int, metrics: dict[str, float]) -> None:
        shown = {"reward": metrics.get("reward/mean"), "acc": metrics.get("accuracy"),
                 "tool": metrics.get("tool/call_rate"), "step_s": metrics.get("timing/step_s")}
        if "val/accuracy" in metrics:
            shown["val_acc"] = metrics["val/accuracy"]
        text = " ".join(f"{k}={v:.2f}" for k, v in shown.items() if v is not None)
        if self.bar is not None:
            self.bar.set_postfix_str(text, refresh=False)
            self.bar.update(step - self.bar.n)
        else:
            log.info("step %d: %s", step, text)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
