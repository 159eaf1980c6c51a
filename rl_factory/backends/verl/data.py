"""Our datasets in the layout verl's RLHFDataset reads.

verl wants Parquet rows with `prompt` (chat messages), `data_source`, `reward_model.ground_truth` and
`extra_info.index`; every other column is handed to the agent loop's `run(**kwargs)` untouched. We
read the user's files with our own loader (JSONL, JSON or Parquet; string or chat prompts; the system
prompt; the same errors naming the bad row) and add two columns of ours:

- `rl_factory_sample`: the whole normalized row as JSON, so rewards see every dataset column exactly
  as in the embedded backend (Parquet would otherwise coerce mixed-type columns);
- `rl_factory_split`: "train" or "val". verl does not tell an agent loop whether it is validating,
  and ArenaRL must know: it waits for all n rollouts of a training prompt, while validation runs
  `val_kwargs.n` of them and is scored pointwise.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rl_factory.components import DataConfig, check_reward_columns, load_rows

SAMPLE_KEY = "rl_factory_sample"
SPLIT_KEY = "rl_factory_split"


def verl_rows(rows: list[dict[str, Any]], split: str) -> list[dict[str, Any]]:
    out = []
    for i, row in enumerate(rows):
        answer = row.get("answer")
        out.append({
            "prompt": row["messages"],
            "data_source": str(row.get("data_source") or "rl_factory"),
            "reward_model": {"style": "rule", "ground_truth": "" if answer is None else str(answer)},
            "extra_info": {"index": i, "split": split},
            SAMPLE_KEY: json.dumps(row, default=str),
            SPLIT_KEY: split,
        })
    return out


def write_parquet(rows: list[dict[str, Any]], path: Path) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    pq.write_table(pa.Table.from_pylist(rows), tmp)
    tmp.replace(path)  # a half-written file never looks like a dataset
    return path


def convert(cfg: DataConfig, out_dir: Path, reward: Any = None) -> dict[str, Path]:
    """Write train.parquet and val.parquet for verl under `out_dir`; returns their paths.

    Args:
        reward: the run's `Scorer`: every row must have the columns it needs (checked before writing).

    Raises:
        DatasetError / ValueError: as the embedded backend's loader (missing file, bad row, a row without a
            column the reward needs, ...).
    """
    train = load_rows(cfg.train_files, cfg)
    val = load_rows(cfg.val_files, cfg, limit=cfg.val_limit)
    if reward is not None:
        check_reward_columns(reward, {"data.train_files": train, "data.val_files": val}, cfg.answer_key)
    return {"train": write_parquet(verl_rows(train, "train"), out_dir / "train.parquet"),
            "val": write_parquet(verl_rows(val, "val"), out_dir / "val.parquet")}


def sample_from_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    """Our row back from the fields verl passes to `AgentLoopBase.run` (the launcher always converts)."""
    if not kwargs.get(SAMPLE_KEY):
        raise ValueError(f"sample {kwargs.get('index')}: no {SAMPLE_KEY} column; rl_factory's agent loop reads the "
                         "data the launcher converts (data.train_files / data.val_files), not verl's own files")
    return json.loads(kwargs[SAMPLE_KEY])
