"""Build the memory example's data: "remember this fact" tasks for a knowledge-graph memory server.

Each row asks the agent to store one fact about a person in its memory (the npm server-memory's
knowledge graph), e.g.

    {"id": "train-003", "prompt": "Remember this in your memory: Ada Quill plays the cello.",
     "person": "Ada Quill", "fact": "plays the cello", "data_source": "memory"}

The reward (examples/memory/reward.py) opens the trajectory's own graph through the episode's tools and
checks that the person is an entity there with the fact among its observations. Seeded and offline.

    python -m examples.memory.prepare_data            # examples/memory/data: 48 train, 12 val
"""
from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

HERE = Path(__file__).resolve().parent
FIRST = ["Ada", "Bram", "Cleo", "Dov", "Esme", "Fitz", "Greta", "Hugo", "Iris", "Jonah", "Kira", "Lev"]
LAST = ["Quill", "Marsh", "Thorne", "Vale", "Brook", "Ashby", "Crane", "Fenn"]
FACTS = ["plays the cello", "keeps bees", "collects maps", "grows tomatoes", "speaks Welsh", "runs marathons",
         "repairs clocks", "paints lighthouses", "bakes rye bread", "sails a dinghy"]


def make_rows(n: int, rng: random.Random, split: str, taken: set[str]) -> list[dict]:
    rows = []
    while len(rows) < n:
        person, fact = f"{rng.choice(FIRST)} {rng.choice(LAST)}", rng.choice(FACTS)
        if person in taken:
            continue
        taken.add(person)
        rows.append({"id": f"{split}-{len(rows):03d}", "prompt": f"Remember this in your memory: {person} {fact}.",
                     "person": person, "fact": fact, "data_source": "memory"})
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out-dir", type=Path, default=HERE / "data")
    parser.add_argument("--n-train", type=int, default=48)
    parser.add_argument("--n-val", type=int, default=12)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    rng, taken = random.Random(args.seed), set()
    args.out_dir.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", args.n_train), ("val", args.n_val)):
        with (args.out_dir / f"{split}.jsonl").open("w", encoding="utf-8") as f:
            for row in make_rows(n, rng, split, taken):
                f.write(json.dumps(row) + "\n")
    print(f"wrote {args.n_train} train and {args.n_val} val rows to {args.out_dir}")


if __name__ == "__main__":
    main()
