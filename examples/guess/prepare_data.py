"""Write examples/guess/data/{train,val}.jsonl: one number-guessing game per row.

Every row has the same prompt (the model cannot see the secret); `answer` is the secret, `low` and
`high` the range. Validation holds every secret once, so its greedy success rate and mean turns
are exact over a uniform secret; training draws secrets uniformly at random.

    .venv/bin/python -m examples.guess.prepare_data [--train-rows 1024] [--seed 0]
"""
from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from rl_factory.models.guess import GuessModelConfig, prompt_text

OUT_DIR = Path(__file__).parent / "data"


def row(kind: str, index: int, secret: int, low: int, high: int) -> dict:
    return {"id": f"{kind}-{index}", "prompt": prompt_text(low, high), "answer": secret, "low": low, "high": high}


def make_rows(train_rows: int, seed: int, low: int, high: int) -> tuple[list[dict], list[dict]]:
    rng = random.Random(seed)
    train = [row("train", i, rng.randint(low, high), low, high) for i in range(train_rows)]
    val = [row("val", i, secret, low, high) for i, secret in enumerate(range(low, high + 1))]
    return train, val


def main(argv: list[str] | None = None) -> None:
    game = GuessModelConfig()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train-rows", type=int, default=1024)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--low", type=int, default=game.low)
    parser.add_argument("--high", type=int, default=game.high)
    parser.add_argument("--out-dir", type=Path, default=OUT_DIR)
    args = parser.parse_args(argv)
    train, val = make_rows(args.train_rows, args.seed, args.low, args.high)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    for name, rows in (("train", train), ("val", val)):
        path = args.out_dir / f"{name}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        print(f"wrote {len(rows)} rows to {path}")


if __name__ == "__main__":
    main()
