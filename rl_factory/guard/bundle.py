"""The bundle a violation leaves in `<run>/guard/step_NNNNNN_<check>/`, and reading it back.

    finding.json          the check, the step, the line, the action taken, the trajectories it names
    check.json            the check's name, its config slice and its state before the step: replay starts here
    step.json             what the step gave the checks (metrics, evidence records, probes, file fingerprints,
                          expected receipts)
    trajectories.jsonl    the offending trajectories as rollouts lines (messages, tool calls, rewards, tokens)
    metrics_window.jsonl  the metrics of the last `trainer.guard.window` steps
    config.yaml           the run's resolved config, secrets redacted
    versions.json         Python and package versions, and the weight fingerprints the trainer recorded

`python -m rl_factory.guard replay <bundle>` reruns the check on step.json (rl_factory/guard/__main__.py).
"""
from __future__ import annotations

import dataclasses
import json
import platform
from pathlib import Path
from typing import Any

from rl_factory.guard.registry import CHECKS, Check, Finding, StepData

GUARD_DIR = "guard"
PACKAGES = ("rl_factory", "torch", "transformers", "peft", "verl", "vllm", "ray", "mcp", "numpy")


def package_versions() -> dict[str, str]:
    from importlib import metadata

    versions = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return versions


def write_bundle(run_dir: Path, finding: Finding, action: str, check: Check, state: dict[str, Any],
                 data: StepData, records: list[dict[str, Any]], window: list[dict[str, Any]],
                 config: dict[str, Any], fingerprints: dict[str, str]) -> Path:
    """Write one violation's bundle; returns its directory."""
    from rl_factory.jsonl import dumps

    out = run_dir / GUARD_DIR / f"step_{finding.step:06d}_{finding.check}"
    out.mkdir(parents=True, exist_ok=True)
    _json(out / "finding.json", {**dataclasses.asdict(finding), "action": action, "line": finding.line()})
    _json(out / "check.json", {"name": check.name, "config": dataclasses.asdict(check.cfg), "state": state})
    _json(out / "step.json", data.to_json())
    (out / "trajectories.jsonl").write_text("".join(dumps(r) for r in records), encoding="utf-8")
    (out / "metrics_window.jsonl").write_text("".join(json.dumps(m, default=str) + "\n" for m in window))
    import yaml

    (out / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    _json(out / "versions.json", {"packages": package_versions(), "weight_fingerprints": fingerprints})
    return out


def _json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=1, default=str))


def load_check(bundle: Path) -> tuple[Check, StepData, dict[str, Any]]:
    """The check as it was before the step, the step's data, and the finding the run recorded."""
    from rl_factory.guard import checks  # noqa: F401  (registers every check)

    saved = json.loads((bundle / "check.json").read_text())
    cls = CHECKS.lookup(saved["name"])
    check = cls(cls.config(**saved["config"]), saved["state"])
    data = StepData.from_json(json.loads((bundle / "step.json").read_text()))
    return check, data, json.loads((bundle / "finding.json").read_text())


def findings(run_dir: Path) -> list[dict[str, Any]]:
    """Every violation recorded in a run directory (the report's guard section), oldest first."""
    root = Path(run_dir) / GUARD_DIR
    out = []
    for path in sorted(root.glob("step_*/finding.json")) if root.is_dir() else []:
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        out.append({**record, "bundle": str(path.parent)})
    return out
