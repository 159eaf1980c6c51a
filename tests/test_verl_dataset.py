"""verl-format datasets load as they are: `answer` from reward_model.ground_truth, dotted answer keys, and the
doctor names the column that became the answer."""
import json

from rl_factory.data import VERL_ANSWER_PATH, load_dataset
from tests.compat_fixtures import DATA_SOURCE, write_verl_parquet
from tests.test_doctor import base, doctor


def test_a_verl_parquet_loads_with_its_ground_truth_as_the_answer(tmp_path):
    path, raw = write_verl_parquet(tmp_path / "train.parquet")
    rows = load_dataset(path)
    assert [r["answer"] for r in rows] == [r["reward_model"]["ground_truth"] for r in raw] == \
        ["7212", "8971", "405", "125"]
    assert rows[0]["messages"] == [{"role": "user", "content": "What is 2033 + 5179?"}]
    assert rows[2]["data_source"] == DATA_SOURCE and rows[2]["extra_info"]["index"] == 2
    assert rows.answer_paths == {VERL_ANSWER_PATH: 4}


def test_an_answer_column_wins_and_dotted_keys_reach_nested_columns(tmp_path):
    path = tmp_path / "rows.jsonl"
    rows = [{"prompt": "q0", "answer": "own", "reward_model": {"ground_truth": "verl's"}},
            {"prompt": "q1", "reward_model": {"ground_truth": "verl's"}},
            {"prompt": "q2", "meta": {"solution": {"text": "deep"}}},
            {"prompt": "q3", "meta.solution.text": "a column with dots in its name"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    loaded = load_dataset(path)
    assert [r["answer"] for r in loaded] == ["own", "verl's", None, None]
    assert loaded.answer_paths == {"answer": 1, VERL_ANSWER_PATH: 1, None: 2}
    nested = load_dataset(path, answer_key="meta.solution.text")
    assert [r["answer"] for r in nested] == [None, None, "deep", "a column with dots in its name"]
    # A key the user chose is where the answer is: no fallback to verl's column.
    assert load_dataset(path, answer_key="solution")[1]["answer"] is None


def test_the_doctor_says_which_column_became_the_answer(tiny_model_dir, tmp_path):
    path, _ = write_verl_parquet(tmp_path / "train.parquet")
    _, checks = doctor(*base(tiny_model_dir, tmp_path), f"data.train_files={path}", f"data.val_files={path}")
    assert checks["data"].status == "pass", checks["data"].detail
    assert "answer from 'reward_model.ground_truth' (verl's layout)" in checks["data"].detail
    _, checks = doctor(*base(tiny_model_dir, tmp_path))  # the calculator's own JSONL
    assert "answer from 'answer';" in checks["data"].detail
