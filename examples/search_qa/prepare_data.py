"""Build train/val JSONL for multi-hop search QA (the Search-R1 / RL-Factory DeepSearch task in miniature).

By default the questions come from the shipped corpus (`examples/search_qa/corpus.jsonl`, fictional
places and people, so a model cannot answer from memory): each needs two searches, the first to find a
bridge entity ("the creator of the Great Map of Dedriarn is Gimoul Kaekiand") and the second to find the
answer in that entity's passage ("... born in Litherk"). Rows are

    {"id": "local-0007", "prompt": "In which city was the creator of ... born?", "answer": ["Litherk", ...],
     "kind": "work_creator_birthplace", "hops": ["work-009", "person-044"], "data_source": "search_qa_local"}

with `answer` a list of acceptable strings for `rewards.rules:exact_match`. Generation is deterministic
(sorted corpus, seeded shuffle), and the val split is disjoint from the train split.

    python -m examples.search_qa.prepare_data                    # from the shipped corpus (offline)
    python -m examples.search_qa.prepare_data --source hotpotqa  # needs network and `pip install datasets`
    python -m examples.search_qa.prepare_data --source nq

`--source nq|hotpotqa` writes the same row shape from Natural Questions (`nq_open`) or HotpotQA
(`hotpot_qa`, distractor setting) through Hugging Face `datasets` (imported only then). Those questions
need a matching corpus (e.g. a Wikipedia dump in the id/title/text JSONL shape, served by setting
`$RL_FACTORY_SEARCH_CORPUS`); this path cannot run offline and is not covered by the tests.
"""
from __future__ import annotations

import argparse
import json
import random
import re
from collections.abc import Callable, Iterable
from pathlib import Path

from rl_factory.jsonl import read_records

HERE = Path(__file__).resolve().parent
CORPUS = HERE / "corpus.jsonl"
DATA_SOURCE = "search_qa_local"

_NAME = r"[A-Z][\w'-]*(?: [A-Z][\w'-]*)*"
_PERSON = re.compile(rf"^({_NAME}) \((\d+)-(\d+)\) was an? [\w ]+? born in ({_NAME}), ({_NAME})\.")
_TEACHER = re.compile(rf"studied under ({_NAME})\.")
_WORK = re.compile(rf" by ({_NAME}) in (\d{{4}})\.")
_CITY = re.compile(rf"^({_NAME}) is a city in ({_NAME}), founded in (\d+)\.")
_COUNTRY = re.compile(rf"Its capital is ({_NAME}), its official language is ({_NAME}) and its currency is the "
                      rf"({_NAME}(?: [a-z]+)*)\.")
_INSTITUTION = re.compile(rf"^The ({_NAME}(?: of {_NAME})?) in ({_NAME}) was founded in (\d+) by ({_NAME})\.")
_RIVER = re.compile(rf"^The ({_NAME} River) rises on the slopes of ({_NAME})")
_MOUNTAIN = re.compile(rf"^({_NAME}) rises ([\d,]+) metres")


def load_corpus(path: Path = CORPUS) -> list[dict]:
    """The corpus passages, sorted by id (so generation does not depend on line order)."""
    rows = read_records(path)
    return sorted(rows, key=lambda r: r["id"])


def _index(passages: list[dict], pattern: re.Pattern, key: int = 1) -> dict[str, tuple[dict, re.Match]]:
    found = {}
    for p in passages:
        match = pattern.search(p["text"])
        if match:
            found[match.group(key)] = (p, match)
    return found


def make_questions(passages: list[dict]) -> list[dict]:
    """Every two-hop question the corpus supports, in a fixed order (see the module docstring)."""
    people = _index(passages, _PERSON)
    countries = {p["title"]: (p, m) for p in passages if (m := _COUNTRY.search(p["text"]))}
    mountains = _index(passages, _MOUNTAIN)
    rows: list[dict] = []

    def add(kind: str, prompt: str, answers: Iterable[str], hops: list[str]) -> None:
        rows.append({"prompt": prompt, "answer": list(dict.fromkeys(answers)), "kind": kind, "hops": hops})

    for p in passages:
        text = p["text"]
        if p["id"].startswith("work-") and (m := _WORK.search(text)) and m.group(1) in people:
            person, pm = people[m.group(1)]
            add("work_creator_birthplace", f"In which city was the creator of {p['title']} born?",
                [pm.group(4), f"{pm.group(4)}, {pm.group(5)}"], [p["id"], person["id"]])
        if p["id"].startswith("person-") and (m := _TEACHER.search(text)) and m.group(1) in people:
            name = _PERSON.search(text).group(1)
            teacher, tm = people[m.group(1)]
            add("teacher_birth_year", f"In what year was the teacher of {name} born?", [tm.group(2)],
                [p["id"], teacher["id"]])
        if (m := _CITY.search(text)) and m.group(2) in countries:
            country, cm = countries[m.group(2)]
            add("city_country_capital", f"What is the capital of the country in which the city of {m.group(1)} "
                "lies?", [cm.group(1)], [p["id"], country["id"]])
            add("city_country_language", f"What is the official language of the country where {m.group(1)} is?",
                [cm.group(2), f"{cm.group(2)} language"], [p["id"], country["id"]])
        if (m := _INSTITUTION.search(text)) and m.group(4) in people:
            founder, fm = people[m.group(4)]
            add("institution_founder_birthplace", f"In which city was the founder of the {m.group(1)} born?",
                [fm.group(4), f"{fm.group(4)}, {fm.group(5)}"], [p["id"], founder["id"]])
        if (m := _RIVER.search(text)) and m.group(2) in mountains:
            mountain, mm = mountains[m.group(2)]
            height = mm.group(2)
            add("river_source_height", f"How many metres high is the mountain where the {m.group(1)} rises?",
                [height, height.replace(",", ""), f"{height} metres", f"{height} m"], [p["id"], mountain["id"]])
    return rows


def split(rows: list[dict], n_val: int, seed: int, prefix: str = "local") -> tuple[list[dict], list[dict]]:
    """Seeded shuffle, ids, then the first `n_val` rows are val and the rest train (disjoint prompts)."""
    rows = list({r["prompt"]: r for r in rows}.values())  # a prompt the corpus supports twice counts once
    random.Random(seed).shuffle(rows)
    rows = [{"id": f"{prefix}-{i:04d}", **r, "data_source": r.get("data_source", DATA_SOURCE)}
            for i, r in enumerate(rows)]
    return rows[n_val:], rows[:n_val]


# ---- public datasets (network) -----------------------------------------------------------------

def _hub_rows(source: str, limit: int | None) -> tuple[list[dict], list[dict]]:
    try:
        import datasets  # only here: the default path has no extra dependency
    except ImportError as exc:
        raise SystemExit("--source nq|hotpotqa needs the `datasets` library: pip install datasets") from exc
    loaders: dict[str, Callable[[], tuple[object, object, Callable[[dict], dict]]]] = {
        "nq": lambda: (datasets.load_dataset("nq_open", split="train"),
                       datasets.load_dataset("nq_open", split="validation"),
                       lambda r: {"prompt": _question(r["question"]), "answer": list(r["answer"])}),
        "hotpotqa": lambda: (datasets.load_dataset("hotpot_qa", "distractor", split="train"),
                             datasets.load_dataset("hotpot_qa", "distractor", split="validation"),
                             lambda r: {"prompt": _question(r["question"]), "answer": [r["answer"]],
                                        "kind": r.get("type"), "level": r.get("level")}),
    }
    train, val, convert = loaders[source]()

    def rows(ds: object, prefix: str) -> list[dict]:
        out = []
        for i, r in enumerate(ds):
            if limit is not None and i >= limit:
                break
            out.append({"id": f"{prefix}-{i:06d}", **convert(r), "data_source": source})
        return out

    return rows(train, f"{source}-train"), rows(val, f"{source}-val")


def _question(text: str) -> str:
    text = text.strip()
    return text[0].upper() + text[1:] + ("" if text.endswith("?") else "?")


def write_jsonl(rows: list[dict], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", choices=["local", "nq", "hotpotqa"], default="local",
                        help="local: two-hop questions from the shipped corpus (default, offline); "
                             "nq / hotpotqa: Hugging Face datasets (network)")
    parser.add_argument("--corpus", type=Path, default=CORPUS, help="local source: the corpus to read")
    parser.add_argument("--out-dir", type=Path, default=HERE / "data")
    parser.add_argument("--n-val", type=int, default=40, help="local source: rows held out for validation")
    parser.add_argument("--limit", type=int, default=None, help="nq / hotpotqa: rows per split (default all)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.source == "local":
        train, val = split(make_questions(load_corpus(args.corpus)), args.n_val, args.seed)
    else:
        train, val = _hub_rows(args.source, args.limit)
    write_jsonl(train, args.out_dir / "train.jsonl")
    write_jsonl(val, args.out_dir / "val.jsonl")
    print(f"wrote {len(train)} train and {len(val)} val questions ({args.source}) to {args.out_dir}")


if __name__ == "__main__":
    main()
