"""The report's charts as plotly.js figure specs (plain dicts: `{"id", "title", "data", "layout"}`).

Each chart is built only when some run has its metrics, so a run without tools, without an arena
or without KL shows no empty charts. Several runs overlay: one color per run, training solid and
validation dashed. Metric names are the `metrics.jsonl` contract (README "Training"), matched by
pattern where a family is open-ended (`tool/errors/<kind>`, `tool/<name>/calls`, `actor/*kl*`).
"""
from __future__ import annotations

import re
import statistics
from collections import defaultdict
from typing import Any, Callable

from rl_factory.report.data import RunData

COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#7f7f7f"]
TIMING_PHASES = [("timing/rollout_s", "rollout"), ("timing/reward_s", "reward"), ("timing/arena_s", "arena"),
                 ("timing/update_s", "update")]
TOOL_CALLS = re.compile(r"^tool/(?!errors/)(.+)/calls$")
TOOL_ERRORS = re.compile(r"^tool/(?!errors/)(.+)/errors/(.+)$")
UPDATE_KEYS = re.compile(r"^(actor|critic)/.*(kl|entropy|clip|grad_norm|loss|ratio|explained_var)")

FIGURES: list[Callable[[list[RunData]], list[dict]]] = []


def figure(fn: Callable[[list[RunData]], list[dict]]):
    """Register a chart builder; the page shows builders' charts in registration order."""
    FIGURES.append(fn)
    return fn


def build_figures(runs: list[RunData]) -> list[dict]:
    return [fig for builder in FIGURES for fig in builder(runs) if _has_points(fig)]


def _has_points(fig: dict) -> bool:
    return any(len(trace.get("x") or trace.get("z") or trace.get("y") or []) for trace in fig["data"])


def _layout(title: str, y: str = "", **extra: Any) -> dict:
    # The title sits at the top left, above the plot area; plotly's toolbar (shown on hover, report.js) takes the
    # top right, so neither covers the other.
    return {"title": {"text": title, "font": {"size": 14}, "x": 0, "xref": "paper", "xanchor": "left",
                      "y": 1, "yref": "container", "yanchor": "top", "pad": {"t": 10}},
            "xaxis": {"title": {"text": "step"}, "tickformat": "d"},
            "yaxis": {"title": {"text": y}}, "margin": {"l": 55, "r": 15, "t": 48, "b": 90}, "height": 330,
            "legend": {"orientation": "h", "y": -0.38, "yanchor": "top", "font": {"size": 10}},
            "hovermode": "x unified", **extra}


def _line(run: RunData, color: str, key: str, label: str, dash: str = "solid", multi: bool = False) -> dict:
    xs, ys = run.series(key)
    name = f"{run.name}: {label}" if multi else label
    return {"type": "scatter", "mode": "lines+markers", "x": xs, "y": ys, "name": name,
            "line": {"color": color, "dash": dash, "width": 2}, "marker": {"size": 4}}


def _metric_chart(fig_id: str, title: str, y: str, runs: list[RunData], keys: list[tuple[str, str]],
                  **layout: Any) -> list[dict]:
    """One line per (run, key): `val/` keys dashed, other keys of one run in the run's color shades."""
    multi = len(runs) > 1
    data = []
    for r, run in enumerate(runs):
        for k, (key, label) in enumerate(keys):
            if key not in run.metric_names:
                continue
            color = COLORS[r % len(COLORS)] if multi else COLORS[k % len(COLORS)]
            dash = "dash" if key.startswith("val/") else ("dot" if multi and k % 2 else "solid")
            data.append(_line(run, color, key, label, dash, multi))
    return [{"id": fig_id, "title": title, "data": data, "layout": _layout(title, y, **layout)}]


@figure
def reward_curves(runs):
    return _metric_chart("reward", "Reward", "mean reward", runs,
                         [("reward/mean", "train reward"), ("val/reward/mean", "val reward")])


@figure
def accuracy_curves(runs):
    return _metric_chart("accuracy", "Accuracy", "share correct", runs,
                         [("accuracy", "train accuracy"), ("val/accuracy", "val accuracy")],
                         yaxis={"title": {"text": "share correct"}, "range": [-0.02, 1.02]})


@figure
def tool_use(runs):
    return _metric_chart("tool_use", "Tool calls", "rate", runs,
                         [("tool/call_rate", "call rate (train)"), ("tool/success_rate", "success rate (train)"),
                          ("val/tool/call_rate", "call rate (val)"), ("val/tool/success_rate", "success rate (val)")],
                         yaxis={"title": {"text": "rate"}, "range": [-0.02, 1.02]})


@figure
def tool_errors_by_kind(runs):
    """Failed calls per step by kind (parse, unknown_tool, bad_arguments, timeout, server_error, crashed)."""
    multi, data = len(runs) > 1, []
    for r, run in enumerate(runs):
        kinds = sorted(k.split("/", 2)[2] for k in run.metric_names if k.startswith("tool/errors/"))
        for k, kind in enumerate(kinds):
            xs, ys = run.series(f"tool/errors/{kind}")
            data.append({"type": "bar", "x": xs, "y": ys, "name": f"{run.name}: {kind}" if multi else kind,
                         "marker": {"color": COLORS[(k + r * 3) % len(COLORS)]},
                         **({"offsetgroup": run.name} if multi else {})})
    title = "Tool errors by kind"
    return [{"id": "tool_errors", "title": title, "data": data,
             "layout": _layout(title, "failed calls per step", barmode="group" if multi else "stack")}]


@figure
def tool_errors_by_tool(runs):
    """Calls and failures of each tool over the whole run, failures split by kind."""
    data, multi = [], len(runs) > 1
    for r, run in enumerate(runs):
        totals: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        for m in run.metrics:
            for key, value in m.items():
                if not isinstance(value, (int, float)) or key.startswith("val/"):
                    continue
                if (match := TOOL_ERRORS.match(key)):
                    totals[match.group(1)][match.group(2)] += value
                elif (match := TOOL_CALLS.match(key)):
                    totals[match.group(1)]["calls"] += value
        tools = sorted(totals)
        kinds = sorted({k for t in totals.values() for k in t} - {"calls"})
        for k, kind in enumerate(["calls", *kinds]):
            ok = [totals[t].get("calls", 0) - sum(v for kk, v in totals[t].items() if kk != "calls") for t in tools]
            ys = ok if kind == "calls" else [totals[t].get(kind, 0) for t in tools]
            data.append({"type": "bar", "x": [f"{run.name}: {t}" if multi else t for t in tools], "y": ys,
                         "name": "succeeded" if kind == "calls" else kind,
                         "marker": {"color": COLORS[(k + 2) % len(COLORS)] if kind != "calls" else "#7fbf7f"},
                         "showlegend": r == 0})
    title = "Calls per tool (whole run)"
    layout = _layout(title, "calls", barmode="stack", hovermode="closest")
    layout["xaxis"] = {"title": {"text": "tool"}}
    return [{"id": "tool_by_tool", "title": title, "data": data, "layout": layout}]


@figure
def turns(runs):
    return _metric_chart("turns", "Turns per trajectory", "turns", runs,
                         [("num_turns/mean", "train"), ("val/num_turns/mean", "val"),
                          ("tool/calls_per_trajectory", "tool calls per trajectory")])


@figure
def lengths(runs):
    return _metric_chart("lengths", "Lengths", "tokens", runs,
                         [("response_tokens/mean", "generated tokens"), ("sequence_tokens/mean", "sequence tokens"),
                          ("val/response_tokens/mean", "val generated tokens")])


@figure
def stop_reasons(runs):
    keys = sorted({k for run in runs for k in run.metric_names if k.startswith("stop/")})
    return _metric_chart("stop", "Why trajectories stopped", "share", runs,
                         [(k, k.split("/", 1)[1]) for k in keys])


@figure
def timing(runs):
    """Seconds per step by phase, stacked; `other` is the rest of step_s (logging, writing rollouts; on verl
    also validation). The embedded backend times validation apart (timing/val_s, outside step_s): its own bar."""
    multi, data = len(runs) > 1, []
    for r, run in enumerate(runs):
        steps = [m for m in run.metrics if "timing/step_s" in m]
        phases = [(k, label) for k, label in TIMING_PHASES if any(k in m for m in steps)]
        beside = [("timing/val_s", "validation")] if any("timing/val_s" in m for m in steps) else []
        for p, (key, label) in enumerate([*phases, ("other", "other"), *beside]):
            if key == "other":
                ys = [max(0.0, m["timing/step_s"] - sum(m.get(k) or 0.0 for k, _ in phases)) for m in steps]
            else:
                ys = [m.get(key) or 0.0 for m in steps]
            data.append({"type": "bar", "x": [m["step"] for m in steps], "y": ys,
                         "name": f"{run.name}: {label}" if multi else label,
                         "marker": {"color": COLORS[p % len(COLORS)], "opacity": 1.0 - 0.35 * (r % 2)},
                         **({"offsetgroup": run.name} if multi else {})})
    title = "Time per step by phase"
    return [{"id": "timing", "title": title, "data": data, "layout": _layout(title, "seconds", barmode="stack")}]


@figure
def generation_vs_tools(runs):
    return _metric_chart("overlap", "Generation and tools", "seconds / share", runs,
                         [("timing/generate_s", "generating (s)"), ("timing/tools_s", "in tools (s)"),
                          ("timing/tools_hidden", "tool time hidden by generation (share)")])


@figure
def policy_update(runs):
    keys = sorted({k for run in runs for k in run.metric_names if UPDATE_KEYS.match(k)})
    return _metric_chart("update", "Policy update (KL, entropy, clipping, loss)", "value", runs,
                         [(k, k) for k in keys])


@figure
def arena_win_matrix(runs):
    """P(rollout ranked a beats rollout ranked b), over every judged match (matches.csv + rankings.csv)."""
    figs = []
    for run in runs:
        if not run.matches or not run.rankings:
            continue
        rank = {(row["step"], row["group"], row["rollout"]): row["rank"] for row in run.rankings}
        n = max(int(r) for r in rank.values())
        wins = [[0.0] * n for _ in range(n)]
        played = [[0] * n for _ in range(n)]
        for m in run.matches:
            ra, rb = rank.get((m["step"], m["group"], m["a"])), rank.get((m["step"], m["group"], m["b"]))
            if ra is None or rb is None:
                continue
            wins[ra - 1][rb - 1] += m["score"]
            wins[rb - 1][ra - 1] += 1.0 - m["score"]
            played[ra - 1][rb - 1] += 1
            played[rb - 1][ra - 1] += 1
        z = [[wins[i][j] / played[i][j] if played[i][j] else None for j in range(n)] for i in range(n)]
        labels = [f"rank {i + 1}" for i in range(n)]
        title = f"Arena win matrix by final rank ({run.name})"
        layout = _layout(title, "rollout ranked", hovermode="closest", height=340)
        layout["xaxis"] = {"title": {"text": "against rollout ranked"}}
        layout["yaxis"] = {"title": {"text": "rollout ranked"}, "autorange": "reversed"}
        figs.append({"id": f"arena_matrix_{len(figs)}", "title": title, "layout": layout, "data": [
            {"type": "heatmap", "z": z, "x": labels, "y": labels, "zmin": 0, "zmax": 1, "colorscale": "RdBu",
             "colorbar": {"title": {"text": "win rate"}}, "hovertemplate": "%{y} vs %{x}: %{z:.2f}<extra></extra>"}]})
    return figs


@figure
def arena_rank_stability(runs):
    """Per step: how well the tournament's ranking agrees with the pointwise reward, and how decisive it is."""
    multi, data = len(runs) > 1, []
    for r, run in enumerate(runs):
        if not run.rankings:
            continue
        by_step: dict[int, list[dict]] = defaultdict(list)
        for row in run.rankings:
            by_step[int(row["step"])].append(row)
        steps = sorted(by_step)
        strict, top_share = [], []
        for step in steps:
            groups: dict[Any, list[dict]] = defaultdict(list)
            for row in by_step[step]:
                groups[row["group"]].append(row)
            strict.append(statistics.fmean(len({g["rank"] for g in rows}) == len(rows) for rows in groups.values()))
            top_share.append(statistics.fmean(sum(g["rank"] == 1 for g in rows) / len(rows) for rows in groups.values()))
        color = COLORS[r % len(COLORS)]
        prefix = f"{run.name}: " if multi else ""
        data.append({"type": "scatter", "mode": "lines+markers", "x": steps, "y": strict,
                     "name": f"{prefix}groups fully ordered (no tied ranks)", "line": {"color": color}})
        data.append({"type": "scatter", "mode": "lines+markers", "x": steps, "y": top_share,
                     "name": f"{prefix}share of rollouts tied at rank 1", "line": {"color": color, "dash": "dot"}})
        xs, ys = run.series("arena/reward_spearman")
        if xs:
            data.append({"type": "scatter", "mode": "lines+markers", "x": xs, "y": ys,
                         "name": f"{prefix}Spearman(tournament score, reward)", "line": {"color": color, "dash": "dash"}})
    title = "Arena rank stability"
    return [{"id": "arena_stability", "title": title, "data": data,
             "layout": _layout(title, "share / correlation", yaxis={"range": [-1.05, 1.05]})}]


@figure
def eval_breakdown(runs):
    """Evaluation directories: accuracy per data_source and pass@k, one bar group per run."""
    figs = []
    evals = [r for r in runs if r.eval_results]
    if not evals:
        return figs
    data = []
    for r, run in enumerate(evals):
        sources = run.eval_results.get("by_data_source") or {}
        if sources:
            names = sorted(sources)
            data.append({"type": "bar", "x": names, "y": [sources[s].get("accuracy") for s in names],
                         "name": run.name, "marker": {"color": COLORS[r % len(COLORS)]}})
    if data:
        layout = _layout("Accuracy per data_source", "accuracy", barmode="group", hovermode="closest")
        layout["xaxis"] = {"title": {"text": "data_source"}}
        figs.append({"id": "eval_sources", "title": "Accuracy per data_source", "data": data, "layout": layout})
    data = []
    for r, run in enumerate(evals):
        pass_at = run.eval_results.get("pass_at_k") or {}
        ks = sorted(pass_at, key=lambda k: int(k))
        if ks:
            data.append({"type": "scatter", "mode": "lines+markers", "x": [int(k) for k in ks],
                         "y": [pass_at[k] for k in ks], "name": run.name, "line": {"color": COLORS[r % len(COLORS)]}})
    if data:
        layout = _layout("pass@k", "pass@k", hovermode="closest", yaxis={"range": [-0.02, 1.02]})
        layout["xaxis"] = {"title": {"text": "k"}, "type": "log"}
        figs.append({"id": "eval_pass_at_k", "title": "pass@k", "data": data, "layout": layout})
    return figs
