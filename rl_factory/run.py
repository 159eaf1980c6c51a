"""The run directory, console progress and the closing summary.

Layout (DESIGN §5): config.yaml, metrics.jsonl, rollouts/, checkpoints/step_NNNNNN/, train.log.
"""
from __future__ import annotations

import logging
import math
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from rl_factory import checkpoint as ckpt
from rl_factory.config import ConfigError, redacted

log = logging.getLogger("rl_factory")


class RunDir:
    """Owns `trainer.output_dir`: creates it, writes config.yaml and train.log, finds resume points."""

    def __init__(self, path: Path):
        self.path = path
        self.config: dict = {}
        self.t0 = time.time()

    def resume_point(self, resume: str) -> Path | None:
        if resume in ("never", "false", "False", None):
            return None
        if resume == "auto":
            return ckpt.latest_checkpoint(self.path)
        path = Path(resume)
        if not (path / ckpt.STATE_FILE).exists():
            raise ConfigError(f"trainer.resume: {resume} is not a checkpoint directory (no {ckpt.STATE_FILE})")
        return path

    def start(self, cfg, resumed: bool) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        setup_logging(self.path / "train.log")
        self.config = redacted(cfg)
        (self.path / "config.yaml").write_text(yaml.safe_dump(self.config, sort_keys=False))
        log.info("%s run in %s", "resuming" if resumed else "starting", self.path)

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
            f"  run directory:      {self.path}  (metrics.jsonl, rollouts/, train.log)",
            f"  last checkpoint:    {summary['checkpoint']}",
        ]
        for line in lines:
            log.info(line)
        return summary


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


def setup_logging(log_file: Path | None = None, level: int = logging.INFO) -> None:
    root = logging.getLogger("rl_factory")
    root.setLevel(level)
    root.propagate = False
    for handler in list(root.handlers):
        root.removeHandler(handler)
        handler.close()
    console = _TqdmHandler()
    console.setFormatter(logging.Formatter("%(message)s"))
    root.addHandler(console)
    if log_file is not None:
        file = logging.FileHandler(log_file, encoding="utf-8")
        file.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
        root.addHandler(file)


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
