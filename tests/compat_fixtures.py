"""Fixtures in other frameworks' formats, written by us (never copied from those projects): a dataset in
verl's preprocessing layout, and where the reward, manifest and tool fixtures live (tests/fixtures/compat)."""
from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "compat"
VERL_REWARD = FIXTURES / "verl_reward.py"
PYDATA = FIXTURES / "tools.pydata"
DATA_SOURCE = "calc/verl"


def verl_rows(questions: list[tuple[int, str, int]], split: str = "train") -> list[dict]:
    """Rows as verl's examples/data_preprocess scripts write them: data_source, prompt (chat messages),
    ability, reward_model {style, ground_truth}, extra_info {split, index, ...}; no `answer` column."""
    return [{"data_source": DATA_SOURCE,
             "prompt": [{"role": "user", "content": f"What is {a} {op} {b}?"}],
             "ability": "math",
             "reward_model": {"style": "rule", "ground_truth": str(eval(f"{a} {op} {b}"))},  # noqa: S307 - our numbers
             "extra_info": {"split": split, "index": i, "question": f"{a} {op} {b}"}}
            for i, (a, op, b) in enumerate(questions)]


def write_verl_parquet(path: Path, split: str = "train") -> tuple[Path, list[dict]]:
    rows = verl_rows([(2033, "+", 5179), (607, "+", 8364), (15, "*", 27), (120, "+", 5)], split)
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path, rows
