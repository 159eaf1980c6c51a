"""Generate the travel-planning task: one-day itineraries in the fictional cities of `world.py`.

Each request names a city, two sights (museum, park, landmark or market), lunch at a restaurant and
a transport mode. The `answer` column is a reference itinerary (the best-rated place of each kind,
lunch in between, with the routes' times and the prices): ArenaRL can use it as an outside anchor
(`algorithm.arena.anchor=reference`) and `main_eval.sh` can show it next to the model's plan. The
`city`, `categories` and `mode` columns reach the reward function under their own names.

    python -m examples.travel.prepare_data --out-dir examples/travel/data
"""
from __future__ import annotations

import argparse
import itertools
import json
import random
from pathlib import Path

from examples.travel.world import CITIES, MODES, travel

SIGHTS = ("museum", "park", "landmark", "market")


def best(city: str, category: str):
    return max((p for p in CITIES[city] if p.category == category), key=lambda p: p.rating)


def reference_plan(city: str, first: str, second: str, mode: str) -> str:
    stops = [best(city, first), best(city, "restaurant"), best(city, second)]
    lines = [f"One day in {city} by {mode}:"]
    for k, poi in enumerate(stops, 1):
        lines.append(f"{k}. {poi.name} ({poi.category}, open {poi.hours}, price {poi.price})")
        if k < len(stops):
            km, minutes = travel(poi, stops[k], mode)
            lines.append(f"   -> {stops[k].name}: {km} km, about {minutes} min by {mode}")
    lines.append(f"Total entry and meal cost: {sum(p.price for p in stops)}.")
    return "\n".join(lines)


def make_rows() -> list[dict]:
    rows = []
    for city, (first, second), mode in itertools.product(CITIES, itertools.permutations(SIGHTS, 2), MODES):
        prompt = (f"Plan a one-day trip in {city}, travelling by {mode}. I want to visit a {first} and a "
                  f"{second}, with lunch at a restaurant in between. Give the order of the visits, the "
                  "travel time between them and the prices.")
        rows.append({"prompt": prompt, "answer": reference_plan(city, first, second, mode), "city": city,
                     "categories": [first, "restaurant", second], "mode": mode})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out-dir", default="examples/travel/data")
    parser.add_argument("--val", type=int, default=24, help="rows held out for validation")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rows = make_rows()
    random.Random(args.seed).shuffle(rows)
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for name, part in (("val", rows[: args.val]), ("train", rows[args.val:])):
        with (out / f"{name}.jsonl").open("w") as f:
            f.writelines(json.dumps(r) + "\n" for r in part)
        print(f"{out / name}.jsonl: {len(part)} rows")


if __name__ == "__main__":
    main()
