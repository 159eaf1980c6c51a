"""Generate the calculator task: arithmetic too long for a tiny model to do in its head.

Each question is one multi-digit product or sum ("What is 347 * 29?"), so a single calculator
call solves it and the reward (`rewards.exact_match:numeric_exact_match`) is 0/1 on the exact
integer. Generation is seeded and the validation questions are disjoint from the training ones.

    python -m examples.calculator.prepare_data --out-dir examples/calculator/data
"""
from __future__ import annotations

import argparse
import json
import random
from collections.abc import Iterable
from pathlib import Path

# kind -> (operator, digits of the first operand, digits of the second operand)
QUESTION_KINDS: dict[str, tuple[str, int, int]] = {
    "mul_3x2": ("*", 3, 2),
    "mul_3x3": ("*", 3, 3),
    "add_4+4": ("+", 4, 4),
    "add_3+4": ("+", 3, 4),
}
OPERATORS = {"*": lambda a, b: a * b, "+": lambda a, b: a + b}


def _operand(rng: random.Random, digits: int) -> int:
    return rng.randint(10 ** (digits - 1), 10**digits - 1)


def make_questions(n: int, seed: int, exclude: Iterable[str] = ()) -> list[dict[str, str]]:
    """`n` distinct arithmetic questions, the same for the same seed.

    Args:
        n: how many questions.
        seed: RNG seed.
        exclude: prompts never to produce (pass the training prompts to build a disjoint val set).

    Returns:
        Rows {"prompt": "What is 347 * 29?", "answer": "10063", "kind": "mul_3x2"}.
    """
    rng = random.Random(seed)
    kinds = sorted(QUESTION_KINDS)
    seen, rows = set(exclude), []
    for _ in range(100 * n + 1000):  # the question space is ~10^7, so this never runs dry
        if len(rows) == n:
            return rows
        kind = kinds[rng.randrange(len(kinds))]
        op, digits_a, digits_b = QUESTION_KINDS[kind]
        a, b = _operand(rng, digits_a), _operand(rng, digits_b)
        prompt = f"What is {a} {op} {b}?"
        if prompt in seen:
            continue
        seen.add(prompt)
        rows.append({"prompt": prompt, "answer": str(OPERATORS[op](a, b)), "kind": kind})
    raise RuntimeError(f"could not generate {n} distinct questions")


def write_jsonl(rows: list[dict[str, str]], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out-dir", type=Path, default=Path(__file__).parent / "data")
    parser.add_argument("--n-train", type=int, default=2000)
    parser.add_argument("--n-val", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    train = make_questions(args.n_train, args.seed)
    val = make_questions(args.n_val, args.seed + 1, exclude={r["prompt"] for r in train})
    write_jsonl(train, args.out_dir / "train.jsonl")
    write_jsonl(val, args.out_dir / "val.jsonl")
    print(f"wrote {len(train)} train and {len(val)} val questions to {args.out_dir}")


if __name__ == "__main__":
    main()
