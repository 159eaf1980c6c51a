"""The search-QA example: deterministic two-hop questions from the shipped corpus, and its reward."""
import asyncio
import json

import pytest

from envs import ToolEnv
from examples.search_qa.prepare_data import CORPUS, load_corpus, main, make_questions, split
from rewards.combine import RewardConfig
from rewards.scorer import build_scorer
from rewards.rules import normalize_answer
from rl_factory.types import ToolCall, Trajectory, Turn

ROOT = CORPUS.parents[2]
# The reward of examples/search_qa/README.md.
FUNCTIONS = [{"function": "rewards.rules:exact_match", "weight": 1.0, "name": "correct"},
             {"function": "rewards.rules:tags_present", "weight": 0.1, "name": "format",
              "kwargs": {"tags": ["answer"]}}]


@pytest.fixture(scope="module")
def rows():
    return make_questions(load_corpus())


def test_generation_is_deterministic_and_splits_are_disjoint(tmp_path, rows):
    main(["--out-dir", str(tmp_path / "a")])
    main(["--out-dir", str(tmp_path / "b")])
    for name in ("train.jsonl", "val.jsonl"):
        assert (tmp_path / "a" / name).read_text() == (tmp_path / "b" / name).read_text()
    train = [json.loads(line) for line in (tmp_path / "a" / "train.jsonl").read_text().splitlines()]
    val = [json.loads(line) for line in (tmp_path / "a" / "val.jsonl").read_text().splitlines()]
    assert len(val) == 40 and len(train) >= 100
    assert not {r["prompt"] for r in train} & {r["prompt"] for r in val}
    assert len({r["id"] for r in train + val}) == len(train) + len(val)
    # The shipped data files are what the script writes.
    shipped = (ROOT / "examples" / "search_qa" / "data" / "val.jsonl").read_text()
    assert shipped == (tmp_path / "a" / "val.jsonl").read_text()


def test_rows_are_well_formed_and_answers_are_in_the_second_hop(rows):
    passages = {p["id"]: p for p in load_corpus()}
    assert len({r["kind"] for r in rows}) == 6
    for row in rows:
        assert set(row) == {"prompt", "answer", "kind", "hops"} and row["prompt"].endswith("?")
        assert isinstance(row["answer"], list) and all(isinstance(a, str) and a for a in row["answer"])
        first, second = (passages[h] for h in row["hops"])
        assert row["answer"][0] in second["text"]  # found only by the second search...
        assert normalize_answer(row["answer"][0]) not in normalize_answer(row["prompt"])  # ...not given away


def test_first_hop_is_findable_with_the_question(rows):
    row = next(r for r in rows if r["kind"] == "work_creator_birthplace")

    async def run():
        async with ToolEnv.from_manifest(ROOT / "configs" / "tools" / "search.yaml") as env:
            return (await env.call_batch([ToolCall("search", {"query": row["prompt"], "top_k": 5})]))[0]

    result = asyncio.run(run())
    assert result.ok and f"[{row['hops'][0]}]" in result.text


def _traj(text: str, answer) -> Trajectory:
    return Trajectory(sample_index=0, prompt_ids=[0], token_ids=[0, 1], loss_mask=[0, 1], logprobs=[0.0, 0.0],
                      messages=[{"role": "user", "content": "q"}, {"role": "assistant", "content": text}],
                      turns=[Turn(generated_ids=[1], logprobs=[0.0], text=text)], stop_reason="stop",
                      sample={"prompt": "q", "answer": answer})


@pytest.mark.parametrize("text, total", [
    ("It was Litherk. <answer>Litherk</answer>", 1.1),
    ("<answer>the Litherk!</answer>", 1.1),  # Search-R1 normalization: case, articles, punctuation
    ("<answer>Litherk, Naimunmark</answer>", 1.1),  # another acceptable string
    ("<answer>Godav</answer>", 0.1),  # right format, wrong answer
    ("Litherk", 1.0),  # no tags: the whole completion is the answer, no format bonus
    ("<answer> </answer>", 0.0),
])
def test_reward_on_hand_made_completions(text, total):
    reward = build_scorer(RewardConfig(functions=FUNCTIONS))
    traj = _traj(text, ["Litherk", "Litherk, Naimunmark"])
    value = asyncio.run(reward.score(traj))
    assert value == pytest.approx(total) and set(traj.reward_info) == {"correct", "format"}


def test_split_is_seeded(rows):
    assert split(rows, 5, seed=1) == split(rows, 5, seed=1) != split(rows, 5, seed=2)
