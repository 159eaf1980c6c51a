"""Reading a run's JSON-lines files in tests the way the project writes them.

Rollouts hold model text, which our writers keep raw (rl_factory/jsonl.py): U+2028, U+2029 and U+0085 among it,
which `str.splitlines()` breaks a record on. So tests split on "\\n" only, through `rl_factory.jsonl`; unlike
`read_records`, a file that is missing fails the test instead of reading as empty.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from rl_factory.jsonl import read_records


def jsonl(path: str | Path) -> list[Any]:
    """Every record of `path`, which must exist."""
    assert Path(path).is_file(), f"{path} was not written"
    return read_records(path)
