"""The trajectory browser's data: the rollout files, flattened to what a person filters and reads.

Each trajectory becomes one compact record: where it came from (run, split, step, and its group: the
prompt's place in the step and the trajectory's among that prompt's rollouts), its outcome
(reward, components, advantage, stop reason), its tool-call failures by kind, and the messages with
tool calls and tool results kept apart. Long message texts are cut at `MAX_TEXT_CHARS` (visibly).
A run with more trajectories than the page can hold keeps every validation/eval trajectory and an
even share of each training step's, so early and late behaviour stay comparable.
"""
from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from rl_factory.report.data import RunData

MAX_TEXT_CHARS = 4000
DEFAULT_MAX_TRAJECTORIES = 3000


def browser_records(runs: list[RunData], max_trajectories: int = DEFAULT_MAX_TRAJECTORIES,
                    on_file: Callable[[], None] | None = None) -> tuple[list[dict], int]:
    """(records for the page, how many trajectories the runs hold in all).

    Lines are counted first and only the kept ones are parsed, so a long run's report stays quick.
    """
    files = [(run, split, step, path) for run in runs for split, step, path in run.rollout_files]
    lines = []
    for *_, path in files:
        lines.append([line for line in path.read_bytes().splitlines() if line.strip()])
        if on_file is not None:
            on_file()
    total = sum(len(f) for f in lines)
    kept_val = sum(len(f) for (_, split, *_), f in zip(files, lines) if split != "train")
    train_files = sum(split == "train" for _, split, *_ in files)
    quota = max(1, (max_trajectories - kept_val) // max(1, train_files)) if total > max_trajectories else None
    records = []
    for (run, split, step, _), rows in zip(files, lines):
        indices = range(len(rows))
        if quota is not None and split == "train" and len(rows) > quota:
            indices = [int(i * len(rows) / quota) for i in range(quota)]
        groups = group_positions(rows)
        for i in indices:
            row = _json_line(rows[i])
            if row is not None:
                records.append({**_record(run.name, split, step, i, row), "group": groups[i][0], "rollout": groups[i][1]})
    return records, total


_SAMPLE_INDEX = re.compile(rb'^\{"sample_index": (-?\d+|null)')


def group_positions(rows: list[bytes]) -> list[tuple[int, int]]:
    """(group, rollout) of each line of a rollouts file: a step's file holds each prompt's n rollouts one after
    another, so a group is a run of lines with the same sample_index (read from the line's head, which
    `trajectory_record` writes first: no line is parsed for it)."""
    out: list[tuple[int, int]] = []
    previous, group, rollout = None, -1, 0
    for line in rows:
        match = _SAMPLE_INDEX.match(line)
        key = match.group(1) if match else line  # a line written otherwise is its own group
        if key == previous:
            rollout += 1
        else:
            group, rollout, previous = group + 1, 0, key
        out.append((group, rollout))
    return out


def _json_line(line: bytes) -> dict | None:
    import json

    try:
        row = json.loads(line.decode("utf-8", errors="replace"))
    except ValueError:  # a torn last line of a killed run
        return None
    return row if isinstance(row, dict) else None


def _record(run: str, split: str, step: int, index: int, row: dict[str, Any]) -> dict[str, Any]:
    results = row.get("tool_results") or []
    calls = row.get("tool_calls") or []
    errors = [r.get("error_kind") for r in results if r.get("error_kind")]
    # A call the parser could not read counts as "parse" even where no result was recorded (last turn).
    errors += ["parse"] * max(0, sum(bool(c.get("error")) for c in calls) - errors.count("parse"))
    return {
        "run": run, "split": split, "step": step, "i": index,
        "sample": row.get("sample_index"), "id": row.get("id"), "data_source": row.get("data_source"),
        "reward": _number(row.get("reward")), "advantage": _number(row.get("advantage")),
        "reward_info": _jsonable(row.get("reward_info") or {}),
        "process_rewards": row.get("process_rewards") or [],
        "stop": row.get("stop_reason") or "", "turns": row.get("num_turns"),
        "answer": _clip(str(row["answer"])) if row.get("answer") is not None else None,
        "calls": len(calls), "errors": errors,
        "tokens": [row.get("prompt_tokens"), row.get("generated_tokens"), row.get("total_tokens")],
        "messages": _messages(row.get("messages") or [], results),
    }


def _messages(messages: list[dict], results: list[dict]) -> list[dict]:
    """Messages with each tool message paired with its call's result record (name, error kind, latency)."""
    out, k = [], 0
    for m in messages:
        item: dict[str, Any] = {"role": m.get("role", "?"), "content": _clip(_text(m.get("content")))}
        if m.get("tool_calls"):
            item["tool_calls"] = [_call(c) for c in m["tool_calls"]]
        if item["role"] == "tool":
            result = results[k] if k < len(results) else {}
            k += 1
            item.update(name=result.get("name"), error_kind=result.get("error_kind"), latency_s=result.get("latency_s"))
        out.append(item)
    return out


def _call(call: dict) -> dict:
    fn = call.get("function", call)
    arguments = fn.get("arguments")
    return {"name": fn.get("name"), "arguments": _clip(arguments if isinstance(arguments, str) else
                                                        _json(arguments))}


def _text(content: Any) -> str:
    if isinstance(content, list):  # multimodal-style content parts
        return "".join(p.get("text", "") if isinstance(p, dict) else str(p) for p in content)
    return "" if content is None else str(content)


def _clip(text: str) -> str:
    if len(text) <= MAX_TEXT_CHARS:
        return text
    return text[:MAX_TEXT_CHARS] + f" ...[{len(text) - MAX_TEXT_CHARS} more chars]"


def _json(value: Any) -> str:
    import json

    return json.dumps(value, ensure_ascii=False, default=str)


def _jsonable(info: dict) -> dict:
    return {str(k): (v if isinstance(v, (int, float, str, bool)) or v is None else _clip(_json(v)))
            for k, v in info.items()}


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value == value else None
