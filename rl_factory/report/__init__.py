"""The run report: one self-contained HTML file of curves and a trajectory browser, from run directories.

    python -m rl_factory.report outputs/calculator_grpo [outputs/other_run ...] [-o report.html]

    from rl_factory.report import write_report
    write_report("outputs/calculator_grpo")          # -> outputs/calculator_grpo/report.html

It reads only the run-directory contract (`metrics.jsonl`, `rollouts/*.jsonl`, `rankings.csv`,
`matches.csv`, `config.yaml`, `run.json`, the run guard's `guard/*/finding.json`; an evaluation directory's `results.json` and
`rollouts.jsonl`), so any backend that writes the contract gets the same report. The page embeds
plotly.js (from the `plotly` package) and all its data: it opens offline, from disk, with no server.
The embedded trainer writes `<run>/report.html` at every validation and at the end (`trainer.report`).
"""
from __future__ import annotations

import json
import re
import sys
from collections.abc import Sequence
from datetime import datetime
from importlib import resources
from pathlib import Path
from typing import Any

from rl_factory.base.files import write_atomic
from rl_factory.fingerprint import flatten
from rl_factory.guard.bundle import findings as guard_findings
from rl_factory.jsonl import WRITE_ERRORS
from rl_factory.tracking import json_safe
from rl_factory.report.data import RunData, load_run
from rl_factory.report.figures import build_figures
from rl_factory.report.tournaments import tournament_tables
from rl_factory.report.trajectories import DEFAULT_MAX_TRAJECTORIES, browser_records

REPORT_FILE = "report.html"
# Config keys that always differ between runs and say nothing about them.
NOT_A_DIFFERENCE = {"trainer.output_dir"}

__all__ = ["REPORT_FILE", "write_report", "render_report"]


def write_report(run_dirs: str | Path | Sequence[str | Path], out: str | Path | None = None,
                 max_trajectories: int = DEFAULT_MAX_TRAJECTORIES, progress: bool = False,
                 title: str | None = None) -> Path:
    """Write the HTML report of one or more runs; returns its path.

    Args:
        run_dirs: a run directory (or an evaluation output directory), or several to overlay.
        out: the HTML file (default `<first run>/report.html`). Written atomically: a browser
            reloading it during training never sees half a page.
        max_trajectories: trajectories embedded for the browser (every validation/eval one, then an
            even share of each training step's).
        progress: show a progress bar while reading rollout files (the CLI does when on a terminal).
        title: the page title (default: the run names).

    Raises:
        FileNotFoundError: a directory holds no run.
    """
    dirs = [Path(run_dirs)] if isinstance(run_dirs, (str, Path)) else [Path(d) for d in run_dirs]
    out = Path(out) if out is not None else dirs[0] / REPORT_FILE
    html = render_report(dirs, max_trajectories=max_trajectories, progress=progress, title=title)
    out.parent.mkdir(parents=True, exist_ok=True)
    # a lone surrogate in a trajectory (rl_factory.jsonl.WRITE_ERRORS) becomes its JSON escape in the data block
    write_atomic(out, html, errors=WRITE_ERRORS)
    return out


def render_report(dirs: Sequence[Path], max_trajectories: int = DEFAULT_MAX_TRAJECTORIES,
                  progress: bool = False, title: str | None = None) -> str:
    runs = [load_run(d, name=name) for d, name in zip(dirs, _unique_names(dirs))]
    n_files = sum(len(r.rollout_files) for r in runs)
    bar = _progress_bar(n_files, progress)
    try:
        records, total = browser_records(runs, max_trajectories, on_file=bar.update if bar else None)
    finally:
        if bar is not None:
            bar.close()
    title = title or "rl_factory report: " + ", ".join(r.name for r in runs)
    data = {
        "title": title,
        "subtitle": f"{len(runs)} run(s) · {total} trajectories · written {datetime.now():%Y-%m-%d %H:%M:%S}",
        "runs": [_run_summary(r) for r in runs],
        "config_diff": _config_diff(runs),
        "evals": [_eval_summary(r) for r in runs if r.eval_results],
        "guard": [{**f, "run": r.name} for r in runs for f in guard_findings(r.path)],
        "figures": build_figures(runs),
        "tournaments": tournament_tables(runs),
        "trajectories": records,
        "total": total,
    }
    return _page(title, data)


def _progress_bar(total: int, enabled: bool):
    if not enabled or total == 0:
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc="report", unit="file", dynamic_ncols=True, file=sys.stderr)


def _unique_names(dirs: Sequence[Path]) -> list[str]:
    names = [d.name or str(d) for d in dirs]
    if len(set(names)) == len(names):
        return names
    return [str(d) for d in dirs]  # two runs both called "run": show their paths


def _run_summary(run: RunData) -> dict[str, Any]:
    first_val = next((m for m in run.metrics if "val/accuracy" in m), {})
    last_val = next((m for m in reversed(run.metrics) if "val/accuracy" in m), {})
    return {"name": run.name, "run_id": run.run_id or "", "path": str(run.path),
            "steps": max((m["step"] for m in run.metrics), default=0),
            "val_acc_first": first_val.get("val/accuracy"), "val_acc_last": last_val.get("val/accuracy"),
            "val_reward_first": first_val.get("val/reward/mean"), "val_reward_last": last_val.get("val/reward/mean")}


def _config_diff(runs: list[RunData]) -> list[dict[str, Any]]:
    if len(runs) < 2:
        return []
    flat = [flatten(r.config) for r in runs]
    keys = sorted(set().union(*flat) - NOT_A_DIFFERENCE)
    diff = []
    for key in keys:
        values = [json.dumps(f.get(key), default=str) if key in f else "(unset)" for f in flat]
        if len(set(values)) > 1:
            diff.append({"key": key, "values": values})
    return diff


def _eval_summary(run: RunData) -> dict[str, Any]:
    res = run.eval_results or {}
    metrics = [[k, v] for k, v in (res.get("metrics") or {}).items()]
    metrics += [[f"pass@{k}", v] for k, v in (res.get("pass_at_k") or {}).items()]
    failures = [[kind, f["count"], f.get("share"), ", ".join(str(i) for i in f.get("examples", []))]
                for kind, f in (res.get("failures") or {}).items()]
    compare = res.get("compare") or {}
    rows = [[m, c.get("this"), c.get("other"), c.get("difference"),
             f"[{c['ci_low']:.3f}, {c['ci_high']:.3f}]" if c.get("ci_low") is not None else "n/a"]
            for m, c in (compare.get("metrics") or {}).items()]
    summary = (f"model {res.get('model')} on {res.get('rows')} rows, n={res.get('n')}, "
               f"temperature {res.get('temperature')}")
    return {"name": run.name, "summary": summary, "metrics": metrics, "failures": failures,
            "compare": rows, "compare_with": compare.get("other", "")}


def _asset(name: str) -> str:
    return (resources.files("rl_factory.report") / "assets" / name).read_text(encoding="utf-8")


def _page(title: str, data: dict[str, Any]) -> str:
    from plotly.offline import get_plotlyjs

    # "</script>" or "<!--" inside the data block would end or derail it: "<" only occurs inside JSON
    # strings, where the escape backslash-u003c means the same character.
    payload = json.dumps(json_safe(data), ensure_ascii=False, default=str, allow_nan=False).replace("<", "\\u003c")
    escaped = title.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    values = {"TITLE": escaped, "CSS": _asset("report.css"), "DATA": payload, "JS": _asset("report.js"),
              "PLOTLY": get_plotlyjs()}
    # One pass over the template: inserted text (user data, plotly.js) is never scanned for placeholders.
    return re.sub(r"__(TITLE|CSS|DATA|JS|PLOTLY)__", lambda m: values[m.group(1)], _asset("report.html"))

