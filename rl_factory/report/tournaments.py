"""The report's tournament tables: who beat whom in each group of an arena run (rankings.csv + matches.csv).

One table per (step, group): a row per rollout, best rank first, with its rank, tournament score,
wins-losses-ties, its reward and final answer (from the step's rollouts file, when the group is there
whole), and one column per opponent holding the row's score in their match (P(row beats column): 1
won, 0 lost, 0.5 a tie or a split verdict over both orders; empty when the schedule never paired them).
A run with many steps keeps `MAX_STEPS` of them, evenly spaced, the first and the last always.
"""
from __future__ import annotations

import json
from collections import defaultdict
from typing import Any

from rl_factory.jsonl import read_lines
from rl_factory.report.data import RunData

MAX_STEPS = 12
MAX_GROUPS = 16  # tables per step
ANSWER_CHARS = 120


def tournament_tables(runs: list[RunData]) -> list[dict[str, Any]]:
    """[{run, step, group, prompt, players: [...]}] for every run with arena rankings."""
    out = []
    for run in runs:
        if not run.rankings:
            continue
        by_step: dict[int, dict[Any, list[dict]]] = defaultdict(lambda: defaultdict(list))
        for row in run.rankings:
            by_step[int(row["step"])][row["group"]].append(row)
        scores: dict[tuple, float] = {}
        for m in run.matches:
            key = (int(m["step"]), m["group"])
            scores[key + (m["a"], m["b"])] = float(m["score"])
            scores[key + (m["b"], m["a"])] = 1.0 - float(m["score"])
        for step in _kept_steps(sorted(by_step)):
            rollouts, counts = _rollouts(run, step)
            for group, rows in list(by_step[step].items())[:MAX_GROUPS]:
                # rollout i of a group is the prompt's i-th line only when no line of the prompt is missing
                whole = counts.get(rows[0]["prompt"]) == len(rows)
                out.append(_table(run.name, step, group, rows, scores, rollouts if whole else {}))
    return out


def _kept_steps(steps: list[int]) -> list[int]:
    if len(steps) <= MAX_STEPS:
        return steps
    picks = {steps[round(i * (len(steps) - 1) / (MAX_STEPS - 1))] for i in range(MAX_STEPS)}
    return sorted(picks)


def _table(run: str, step: int, group: Any, rows: list[dict], scores: dict, rollouts: dict) -> dict[str, Any]:
    rows = sorted(rows, key=lambda r: (r["rank"], r["rollout"]))
    ids = [r["rollout"] for r in rows]
    players = []
    for r in rows:
        mine = rollouts.get((r["prompt"], r["rollout"]), {})
        ties = r["matches"] - r["wins"] - r["losses"]
        players.append({"rollout": r["rollout"], "rank": r["rank"], "score": r["score"],
                        "record": f"{r['wins']}-{r['losses']}-{ties}", "reward": mine.get("reward"),
                        "answer": mine.get("answer"),
                        "vs": [scores.get((step, group, r["rollout"], o)) for o in ids]})
    return {"run": run, "step": step, "group": group, "prompt": rows[0]["prompt"], "players": players}


def _rollouts(run: RunData, step: int) -> tuple[dict[tuple[Any, int], dict[str, Any]], dict[Any, int]]:
    """((sample_index, rollout) -> reward and final answer, lines per sample_index), from the step's
    training rollouts file."""
    path = next((p for split, s, p in run.rollout_files if split == "train" and s == step), None)
    if path is None:
        return {}, {}
    seen: dict[Any, int] = defaultdict(int)
    out = {}
    for line in read_lines(path):
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        key = row.get("sample_index")
        answers = [m for m in row.get("messages") or [] if m.get("role") == "assistant"]
        answer = str(answers[-1].get("content") or "") if answers else ""
        out[(key, seen[key])] = {"reward": row.get("reward"), "answer": answer[:ANSWER_CHARS]}
        seen[key] += 1
    return out, dict(seen)
