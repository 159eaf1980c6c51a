"""JSON-lines files whose strings hold model and tool text: one way to write a line, one to split them.

Our writers keep non-ASCII text readable (`ensure_ascii=False`), so a line may contain U+0085, U+2028 or
U+2029, which `str.splitlines()` treats as line breaks (JSON escapes only the control characters below
U+0020 inside strings, "\\n" among them). So "\\n" is the only separator: splitting on anything else cuts
a record in two. A random-init 4B model wrote such characters in its first step on the H200 (2026-12-02) and
the verl run died in `json.loads` while gathering its rollouts.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from rl_factory.base.secrets import redact_known

log = logging.getLogger(__name__)
# How files of such lines are opened for writing: a lone surrogate (a Python tool's text from
# undecodable bytes) is written escaped instead of failing the write, and with it the step.
WRITE_ERRORS = "backslashreplace"


def dumps(record: Any) -> str:
    """One line (newline included) for a record of model/tool text: non-ASCII kept readable, and every
    secret this process knows scrubbed (`rl_factory.base.secrets.redact_known`), as everything we write is."""
    return redact_known(json.dumps(record, ensure_ascii=False, default=str)) + "\n"


def read_lines(path: str | Path) -> list[str]:
    """The non-blank lines of a JSON-lines file, split on "\\n" only; [] if it does not exist."""
    path = Path(path)
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    return [line for line in text.split("\n") if line.strip()]


def read_records(path: str | Path, *, torn_ok: bool = False) -> list[Any]:
    """Every record of a JSON-lines file ([] if it does not exist).

    With `torn_ok`, a line that does not parse (the tail a killed writer left) is skipped with a
    warning naming the file and line; otherwise it raises `json.JSONDecodeError`.
    """
    out = []
    for number, line in enumerate(read_lines(path), start=1):
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError as exc:
            if not torn_ok:
                raise
            log.warning("%s line %d: not JSON (%s), skipped: a writer killed mid-line", path, number, exc.msg)
    return out


class Tail:
    """The records appended to JSON-lines files since the last read: the files `pattern` matches under
    `directory` (they may appear at any time; processes append to them while we read), each whole line once.
    A line still being written (no "\\n" yet) waits for the next read; one that never parses (a writer killed
    mid-line, then appended after) is skipped with a warning."""

    def __init__(self, directory: str | Path, pattern: str = "*.jsonl"):
        self.directory, self.pattern = Path(directory), pattern
        self.offsets: dict[Path, int] = {}

    def read(self) -> list[Any]:
        out: list[Any] = []
        for path in sorted(self.directory.glob(self.pattern)) if self.directory.is_dir() else []:
            start = self.offsets.get(path, 0)
            try:
                with path.open("rb") as f:
                    f.seek(start)
                    data = f.read()
            except OSError:
                continue
            whole = data[:data.rfind(b"\n") + 1]
            self.offsets[path] = start + len(whole)
            for raw in whole.split(b"\n"):
                if not raw.strip():
                    continue
                try:
                    out.append(json.loads(raw))
                except ValueError:
                    log.warning("%s: a line that is not JSON, skipped: a writer killed mid-line", path)
        return out
