"""Build the SQL example: one small SQLite database per sample (real sqlite3) and train/val JSONL.

Each sample is a table of a few rows (`inventory`, `accounts` or `books`) in its own database file and an
instruction that changes it: insert a row, or update one. Rows are

    {"id": "train-007", "prompt": "Table inventory(item TEXT PRIMARY KEY, qty INTEGER). Set the qty of pear
     to 12.", "db_path": "examples/sql/data/dbs/train-007.db", "table": "inventory", "kind": "update",
     "check_sql": "SELECT group_concat(...) FROM ...", "expected": "apple=3;pear=12;plum=5",
     "reference_sql": "UPDATE inventory SET qty = 12 WHERE item = 'pear'", "data_source": "sql"}

`expected` is what `check_sql` returns once the instruction is carried out, computed here by running
`reference_sql` on a copy of the database with sqlite3; the reward (examples/sql/reward.py) runs
`check_sql` through the episode's own `run_sql` tool and compares. The whole table is checked, so an
update of the wrong row, a duplicate insert or a deleted row all fail.

    python -m examples.sql.prepare_data                       # examples/sql/data: 64 train, 16 val
    python -m examples.sql.prepare_data --out-dir /tmp/sql    # db_path is then absolute

`db_path` is relative to the current directory when the output lies under it (the trainer runs from
the repository root), else absolute. Generation is seeded; databases are rewritten on every run.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sqlite3
from pathlib import Path

HERE = Path(__file__).resolve().parent
# table -> (key column, value column, keys to draw from, value range)
TABLES = {
    "inventory": ("item", "qty", ["apple", "pear", "plum", "fig", "kiwi", "lime", "mango", "peach"], (1, 40)),
    "accounts": ("name", "balance", ["ada", "bob", "cleo", "dan", "eve", "finn", "gus", "hana"], (10, 90)),
    "books": ("title", "year", ["dune", "emma", "ulysses", "beloved", "rebecca", "walden"], (1800, 2020)),
}


def make_sample(rng: random.Random, split: str, i: int, db_dir: Path) -> dict:
    table = rng.choice(sorted(TABLES))
    key, value, names, (low, high) = TABLES[table]
    present = rng.sample(names, rng.randint(3, 5))
    rows = [(name, rng.randint(low, high)) for name in sorted(present)]
    kind = "insert" if i % 2 == 0 else "update"
    new = rng.randint(low, high)
    if kind == "insert":
        target = rng.choice([n for n in names if n not in present])
        instruction = f"Add {target} with {value} {new}."
        reference = f"INSERT INTO {table} ({key}, {value}) VALUES ('{target}', {new})"
    else:
        target = rng.choice(present)
        new = next(v for v in (new, new + 1) if v != dict(rows)[target])  # an update that changes something
        instruction = f"Set the {value} of {target} to {new}."
        reference = f"UPDATE {table} SET {value} = {new} WHERE {key} = '{target}'"
    path = db_dir / f"{split}-{i:03d}.db"
    _write_db(path, table, key, value, rows)
    check = (f"SELECT group_concat({key} || '=' || {value}, ';') AS rows_now "
             f"FROM (SELECT {key}, {value} FROM {table} ORDER BY {key})")
    return {"id": f"{split}-{i:03d}",
            "prompt": f"Table {table}({key} TEXT PRIMARY KEY, {value} INTEGER). {instruction}",
            "db_path": _shown(path), "table": table, "kind": kind, "check_sql": check,
            "expected": _expected(path, reference, check), "reference_sql": reference, "data_source": "sql"}


def _write_db(path: Path, table: str, key: str, value: str, rows: list[tuple[str, int]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    with sqlite3.connect(path) as conn:
        conn.execute(f"CREATE TABLE {table} ({key} TEXT PRIMARY KEY, {value} INTEGER NOT NULL)")
        conn.executemany(f"INSERT INTO {table} VALUES (?, ?)", rows)
    conn.close()


def _expected(path: Path, reference: str, check: str) -> str:
    """What `check` returns after `reference`, run on an in-memory copy (the file stays as it is)."""
    source, copy = sqlite3.connect(path), sqlite3.connect(":memory:")
    source.backup(copy)
    source.close()
    copy.execute(reference)
    (result,) = copy.execute(check).fetchone()
    copy.close()
    return result


def _shown(path: Path) -> str:
    cwd = Path.cwd().resolve()
    try:
        return str(path.resolve().relative_to(cwd))
    except ValueError:
        return str(path.resolve())


def write_split(out_dir: Path, split: str, n: int, seed: int) -> list[dict]:
    rng = random.Random(f"{seed}-{split}")
    rows = [make_sample(rng, split, i, out_dir / "dbs") for i in range(n)]
    with (out_dir / f"{split}.jsonl").open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out-dir", type=Path, default=HERE / "data")
    parser.add_argument("--n-train", type=int, default=64)
    parser.add_argument("--n-val", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    os.makedirs(args.out_dir, exist_ok=True)
    train = write_split(args.out_dir, "train", args.n_train, args.seed)
    val = write_split(args.out_dir, "val", args.n_val, args.seed)
    print(f"wrote {len(train)} train and {len(val)} val samples, each with its own database under "
          f"{args.out_dir / 'dbs'}")


if __name__ == "__main__":
    main()
