import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from examples.calculator.prepare_data import make_questions
from rl_factory.data import DatasetError, PromptSampler, load_dataset


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_jsonl_string_prompt_with_system_prompt(tmp_path):
    path = write_jsonl(tmp_path / "train.jsonl", [{"prompt": "What is 2+2?", "answer": "4",
                                                   "level": 1}])
    [row] = load_dataset(str(path), system_prompt="Use the calculator.")
    assert row["messages"] == [{"role": "system", "content": "Use the calculator."},
                               {"role": "user", "content": "What is 2+2?"}]
    assert row["answer"] == "4" and row["level"] == 1 and row["prompt"] == "What is 2+2?"


def test_messages_prompt_and_custom_keys(tmp_path):
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    path = write_jsonl(tmp_path / "chat.jsonl", [{"conversation": chat, "solution": "hello"}])
    [row] = load_dataset(path, prompt_key="conversation", answer_key="solution",
                         system_prompt="ignored: the row has its own")
    assert row["messages"] == chat and row["answer"] == "hello"


def test_parquet_with_message_structs_and_limit(tmp_path):
    rows = [{"prompt": [{"role": "user", "content": f"q{i}"}], "answer": str(i)} for i in range(5)]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "train.parquet")
    loaded = load_dataset([tmp_path / "train.parquet"], limit=3)
    assert [r["messages"] for r in loaded] == [[{"role": "user", "content": f"q{i}"}]
                                               for i in range(3)]
    assert [r["answer"] for r in loaded] == ["0", "1", "2"]


def test_multiple_files_in_order(tmp_path):
    a = write_jsonl(tmp_path / "a.jsonl", [{"prompt": "a"}])
    b = write_jsonl(tmp_path / "b.jsonl", [{"prompt": "b"}])
    assert [r["prompt"] for r in load_dataset([a, b])] == ["a", "b"]


def test_missing_prompt_field_names_file_and_line(tmp_path):
    rows = [{"prompt": "ok"}] * 6 + [{"question": "where is my prompt", "answer": "1"}]
    path = write_jsonl(tmp_path / "train.jsonl", rows)
    with pytest.raises(DatasetError, match=r"train\.jsonl line 7: row has no 'prompt' field "
                                           r"\(keys: \['answer', 'question'\]\)"):
        load_dataset(path)


def test_errors(tmp_path):
    with pytest.raises(DatasetError, match="dataset file not found: .*missing.jsonl"):
        load_dataset(tmp_path / "missing.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok"}\n\n{"prompt": oops}\n')
    with pytest.raises(DatasetError, match=r"bad\.jsonl line 3: malformed JSON"):
        load_dataset(bad)
    shape = write_jsonl(tmp_path / "shape.jsonl", [{"prompt": [{"role": "user", "text": "hi"}]}])
    with pytest.raises(DatasetError, match=r"shape\.jsonl line 1: 'prompt' message 0 must be"):
        load_dataset(shape)
    role = write_jsonl(tmp_path / "role.jsonl", [{"prompt": [{"role": "human", "content": "x"}]}])
    with pytest.raises(DatasetError, match="role 'human'"):
        load_dataset(role)
    with pytest.raises(DatasetError, match="unsupported file type '.csv'"):
        load_dataset(tmp_path / "data.csv")


def test_sampler_covers_each_epoch_and_is_deterministic():
    rows = [{"i": i} for i in range(10)]
    a, b = PromptSampler(rows, batch_size=4, seed=3), PromptSampler(rows, batch_size=4, seed=3)
    batches = [next(a) for _ in range(5)]  # 20 rows = exactly two epochs
    assert batches == [next(b) for _ in range(5)]
    first_epoch = [r["i"] for batch in batches for r in batch][:10]
    assert sorted(first_epoch) == list(range(10)) and first_epoch != list(range(10))


def test_sampler_resume_gives_same_batches():
    rows = [{"i": i} for i in range(7)]
    original = PromptSampler(rows, batch_size=3, seed=0)
    for _ in range(4):  # stop mid-epoch, in the second epoch
        next(original)
    state = json.loads(json.dumps(original.state_dict()))  # survives a checkpoint round trip
    resumed = PromptSampler(rows, batch_size=3, seed=0)
    resumed.load_state_dict(state)
    assert [next(resumed) for _ in range(6)] == [next(original) for _ in range(6)]


def test_calculator_questions_are_seeded_and_disjoint():
    train = make_questions(50, seed=0)
    assert train == make_questions(50, seed=0)
    val = make_questions(20, seed=1, exclude={r["prompt"] for r in train})
    assert not {r["prompt"] for r in val} & {r["prompt"] for r in train}
    a, op, b = train[0]["prompt"].removeprefix("What is ").removesuffix("?").split()
    assert int(train[0]["answer"]) == (int(a) * int(b) if op == "*" else int(a) + int(b))


def test_shipped_calculator_data_loads():
    data_dir = Path(__file__).resolve().parents[1] / "examples" / "calculator" / "data"
    train = load_dataset(data_dir / "train.jsonl")
    val = load_dataset(data_dir / "val.jsonl")
    assert len(train) == 2000 and len(val) == 100
    assert not {r["prompt"] for r in train} & {r["prompt"] for r in val}
