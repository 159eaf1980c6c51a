"""Generate the calculator task: arithmetic too long for a tiny model to do in its head.

Each question is one multi-digit product or sum ("What is 347 * 29?"), so a single calculator
call solves it and the reward (`rewards.exact_match:numeric_exact_match`) is 0/1 on the exact
integer. Generation is seeded and the validation questions are disjoint from the training ones.

The hard split (`hard_train.jsonl`, `hard_val.jsonl`) asks the same operations with the operand
lengths the other way round ("What is 4213 + 587?", "What is 29 * 347?"). The embedded default's warm
start copies expressions in the shapes it was shown, so it almost never answers these right (0 of 256
samples at temperature 1 in our check): groups of n wrong answers, whose GRPO advantages are all 0.
benchmarks/dynamic_sampling.py trains on a mix of both.

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
# The same operations with the operand lengths swapped: shapes the warm start never saw.
HARD_KINDS: dict[str, tuple[str, int, int]] = {
    "mul_2x3": ("*", 2, 3),
    "add_4+3": ("+", 4, 3),
}
OPERATORS = {"*": lambda a, b: a * b, "+": lambda a, b: a + b}


def _operand(rng: random.Random, digits: int) -> int:
    return rng.randint(10 ** (digits - 1), 10**digits - 1)


def make_questions(n: int, seed: int, exclude: Iterable[str] = (),
                   kinds: dict[str, tuple[str, int, int]] = QUESTION_KINDS) -> list[dict[str, str]]:
    """`n` distinct arithmetic questions, the same for the same seed.

    Args:
        n: how many questions.
        seed: RNG seed.
        exclude: prompts never to produce (pass the training prompts to build a disjoint val set).
        kinds: question kinds to draw from (QUESTION_KINDS, or HARD_KINDS for the hard split).

    Returns:
        Rows {"prompt": "What is 347 * 29?", "answer": "10063", "kind": "mul_3x2"}.
    """
    rng = random.Random(seed)
    table, kinds = kinds, sorted(kinds)
    seen, rows = set(exclude), []
    for _ in range(100 * n + 1000):  # the question space is ~10^7, so this never runs dry
        if len(rows) == n:
            return rows
        kind = kinds[rng.randrange(len(kinds))]
        op, digits_a, digits_b = table[kind]
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
    parser.add_argument("--n-hard-train", type=int, default=1000)
    parser.add_argument("--n-hard-val", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    train = make_questions(args.n_train, args.seed)
    val = make_questions(args.n_val, args.seed + 1, exclude={r["prompt"] for r in train})
    write_jsonl(train, args.out_dir / "train.jsonl")
    write_jsonl(val, args.out_dir / "val.jsonl")
    hard_train = make_questions(args.n_hard_train, args.seed + 2, kinds=HARD_KINDS)
    hard_val = make_questions(args.n_hard_val, args.seed + 3, exclude={r["prompt"] for r in hard_train}, kinds=HARD_KINDS)
    write_jsonl(hard_train, args.out_dir / "hard_train.jsonl")
    write_jsonl(hard_val, args.out_dir / "hard_val.jsonl")
    print(f"wrote {len(train)} train, {len(val)} val, {len(hard_train)} hard train and {len(hard_val)} hard val "
          f"questions to {args.out_dir}")


if __name__ == "__main__":
    main()
