"""Benchmark records (benchmarks/results/*.jsonl, benchmarks/record.py) read and formatted for the generated pages."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def load(directory: Path) -> dict[str, list[dict[str, Any]]]:
    """benchmark name -> its records in file order; a line that is not JSON is an error naming file and line."""
    out: dict[str, list[dict[str, Any]]] = {}
    for path in sorted(directory.glob("*.jsonl")):
        records = []
        # "\n" only: a record's text may hold U+2028 and the like, which splitlines() breaks on (rl_factory/jsonl.py)
        for number, line in enumerate(path.read_text(encoding="utf-8").split("\n"), 1):
            if not line.strip():
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{number}: not a JSON line ({exc.msg})") from None
        out[path.stem] = records
    return out


def get(record: dict[str, Any], path: str) -> Any:
    """The value at a dotted path; `a.b|a.c`: the first of the paths the record has (a key renamed over time)."""
    if "|" in path:
        return next((v for v in (get(record, alt) for alt in path.split("|")) if v is not None), None)
    node: Any = record
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def fmt(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.4g}" if abs(value) < 1e5 else f"{value:,.0f}"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, list):
        return " / ".join(fmt(v) for v in value)
    if isinstance(value, dict):
        return ", ".join(f"{k} {fmt(v)}" for k, v in value.items())
    return str(value)


def machine_text(m: dict[str, Any]) -> str:
    if not m:
        return ""
    if isinstance(m, str):
        return m
    parts = [str(m.get("cpu", "")) + (" (AVX-512)" if m.get("avx512") else ""), f"{m.get('cores', '?')} cores"]
    if m.get("gpu"):
        parts.insert(0, f"{m.get('gpus', 1)}x {m['gpu']}")
    return ", ".join(p for p in parts if p)
