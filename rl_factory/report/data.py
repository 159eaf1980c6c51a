"""Reading what a run left behind, for the report: the run-directory contract (DESIGN §5) only.

Everything here reads files, never live objects, so the report works the same for an embedded run,
a verl run that writes the same contract, a run killed half-way, or an evaluation directory
(`results.json` + `rollouts.jsonl` from `main_eval.sh`). A torn last line (a run killed mid-write)
is skipped, not fatal.
"""
from __future__ import annotations

import csv
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

ROLLOUT_FILE = re.compile(r"^(val_)?step_(\d+)\.jsonl$")


@dataclass
class RunData:
    """One run's files, loaded: metrics per step, trajectories, arena rankings and matches."""

    name: str
    path: Path
    run_id: str | None = None
    config: dict[str, Any] = field(default_factory=dict)
    metrics: list[dict[str, Any]] = field(default_factory=list)  # one dict per logged step
    rollout_files: list[tuple[str, int, Path]] = field(default_factory=list)  # (split, step, file)
    rankings: list[dict[str, Any]] = field(default_factory=list)
    matches: list[dict[str, Any]] = field(default_factory=list)
    eval_results: dict[str, Any] | None = None  # an evaluation directory's results.json

    @property
    def metric_names(self) -> set[str]:
        return {k for m in self.metrics for k in m if k != "step"}

    def series(self, key: str) -> tuple[list[int], list[float]]:
        """(steps, values) of one metric, skipping steps without a finite value."""
        xs, ys = [], []
        for m in self.metrics:
            value = m.get(key)
            if isinstance(value, (int, float)) and not isinstance(value, bool) and value == value:
                xs.append(int(m["step"]))
                ys.append(float(value))
        return xs, ys


def load_run(path: str | Path, name: str | None = None) -> RunData:
    """Load a run directory (or an evaluation output directory). Raises FileNotFoundError if it holds neither."""
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"{path}: not a directory")
    run = RunData(name=name or path.name, path=path)
    run.metrics = [m for m in read_jsonl(path / "metrics.jsonl") if isinstance(m.get("step"), int)]
    # A resumed run may log a step twice if it was killed between logging and truncation: keep the last.
    run.metrics = list({m["step"]: m for m in run.metrics}.values())
    run.metrics.sort(key=lambda m: m["step"])
    record = _read_json(path / "run.json") or {}
    run.run_id = record.get("run_id")
    run.config = _read_yaml(path / "config.yaml")
    run.rollout_files = rollout_files(path)
    run.rankings = _read_csv(path / "rankings.csv")
    run.matches = _read_csv(path / "matches.csv")
    results = _read_json(path / "results.json")
    if results is not None:
        run.eval_results = results
        if (path / "rollouts.jsonl").exists():
            run.rollout_files.append(("eval", 0, path / "rollouts.jsonl"))
    if not run.metrics and not run.rollout_files and results is None:
        raise FileNotFoundError(f"{path}: no metrics.jsonl, rollouts/ or results.json (not a run directory)")
    return run


def rollout_files(path: Path) -> list[tuple[str, int, Path]]:
    found = []
    for file in (path / "rollouts").glob("*.jsonl") if (path / "rollouts").is_dir() else []:
        match = ROLLOUT_FILE.match(file.name)
        if match:
            found.append(("val" if match.group(1) else "train", int(match.group(2)), file))
    return sorted(found, key=lambda f: (f[1], f[0]))


def read_jsonl(path: Path) -> Iterator[dict[str, Any]]:
    if not path.exists():
        return
    with path.open(encoding="utf-8", errors="replace") as f:
        for line in f:
            try:
                record = json.loads(line)
            except ValueError:  # a torn last line
                continue
            if isinstance(record, dict):
                yield record


def _read_json(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _read_yaml(path: Path) -> dict:
    import yaml

    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return {}
    return data if isinstance(data, dict) else {}


def _read_csv(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    with path.open(newline="", encoding="utf-8") as f:
        return [{k: _number(v) for k, v in row.items()} for row in csv.DictReader(f)]


def _number(text: str | None) -> Any:
    if text is None:
        return None
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text
