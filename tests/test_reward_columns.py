"""A reward that needs a column some rows lack stops the run before training, naming the first such row."""
import json
import logging
from pathlib import Path

import pytest

from rewards.scorer import Scorer
from rl_factory.cli import main
from rl_factory.components import MissingColumn, check_reward_columns
from rl_factory.data import load_dataset

REPO = Path(__file__).resolve().parents[1]
ROWS = [json.loads(line) for line in (REPO / "examples/calculator/data/train.jsonl").read_text().splitlines()[:10]]


def write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def partial(tmp_path: Path, drop: str = "answer", start: int = 7) -> Path:
    rows = [dict(r) for r in ROWS]
    for row in rows[start:]:
        row.pop(drop)
    return write(tmp_path / "partial.jsonl", rows)


def test_training_stops_before_anything_runs(tmp_path, capsys):
    data, run_dir = partial(tmp_path), tmp_path / "run"
    assert main(["train", f"data.train_files={data}", f"trainer.output_dir={run_dir}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {data} row 7 has no 'answer' column, which reward exact_match.py:"
                          "numeric_exact_match needs (as `answer`, from data.answer_key); 7 of 10 rows")
    assert err.count("\n") == 1 and not run_dir.exists()


def test_evaluation_stops_too(tmp_path, capsys):
    data = partial(tmp_path)
    assert main(["eval", f"eval.files={data}", "model.path=builtin:tiny-calculator",
                 f"eval.output_dir={tmp_path / 'eval'}"]) == 2
    assert f"error: {data} row 7 has no 'answer' column" in capsys.readouterr().err
    assert not (tmp_path / "eval").exists()


def reward_file(tmp_path: Path, source: str, name: str = "reward") -> str:
    path = tmp_path / f"{name}.py"  # one file per source: a rewrite within a second could load stale bytecode
    path.write_text(source)
    return f"{path}:reward"


def scorer(spec: str) -> Scorer:
    from rewards.combine import RewardConfig
    from rewards.scorer import build_scorer
    return build_scorer(RewardConfig(function=spec))


def test_a_named_column_missing_from_the_second_file_names_that_file_and_its_row(tmp_path):
    first = write(tmp_path / "a.jsonl", ROWS[:3])
    second = partial(tmp_path, drop="kind", start=1)
    rows = load_dataset([first, second])
    fn = scorer(reward_file(tmp_path, "def reward(completion, kind):\n    return 1.0\n"))
    with pytest.raises(MissingColumn) as err:
        check_reward_columns(fn, {"data.train_files": rows})
    assert str(err.value).startswith(f"{second} row 1 has no 'kind' column, which reward reward.py:reward needs "
                                     "(as `kind`); 4 of 13 rows of data.train_files have it")


def test_a_column_no_row_has_is_refused_unless_it_has_a_default(tmp_path):
    rows = load_dataset(write(tmp_path / "d.jsonl", ROWS[:3]))
    with pytest.raises(MissingColumn, match=r"d.jsonl row 0 has no 'level' column"):
        check_reward_columns(scorer(reward_file(tmp_path, "def reward(completion, level):\n    return 1.0\n")),
                             {"data.val_files": rows})
    # tolerated: a default, **kwargs, a standard argument the row lacks (data_source)
    check_reward_columns(scorer(reward_file(tmp_path, "def reward(completion, level=0, data_source=None, **_):\n"
                                                      "    return 1.0\n", "tolerant")), {"data.val_files": rows})


def test_no_answer_anywhere_is_one_warning_for_a_reward_whose_answer_is_optional(tmp_path, caplog):
    logging.getLogger("rl_factory").addHandler(caplog.handler)  # the CLI's logging does not propagate
    rows = [{k: v for k, v in r.items() if k != "answer"} for r in ROWS[:3]]
    sets = {"data.train_files": load_dataset(write(tmp_path / "t.jsonl", rows)),
            "data.val_files": load_dataset(write(tmp_path / "v.jsonl", rows))}
    check_reward_columns(scorer(reward_file(tmp_path, "def reward(tools, **_):\n    return 1.0\n")), sets)
    assert caplog.records == []  # a reward that does not name `answer` (the SQL example's) hears nothing
    check_reward_columns(scorer(reward_file(tmp_path, "def reward(completion, answer=None):\n    return 1.0\n",
                                            "optional")), sets)
    logging.getLogger("rl_factory").removeHandler(caplog.handler)
    assert [r.getMessage() for r in caplog.records] == [
        "no row has the answer column 'answer' (data.answer_key): reward optional.py:reward gets answer=None"]


def test_the_verl_launcher_checks_before_it_writes_the_parquet_files(tmp_path):
    from rl_factory.backends.verl.data import convert
    from rl_factory.components import DataConfig

    cfg = DataConfig(train_files=str(partial(tmp_path)), val_files=str(write(tmp_path / "v.jsonl", ROWS[:2])))
    fn = scorer(reward_file(tmp_path, "def reward(completion, answer):\n    return 1.0\n"))
    with pytest.raises(MissingColumn, match=r"partial.jsonl row 7 has no 'answer' column"):
        convert(cfg, tmp_path / "verl_data", reward=fn)
    assert not (tmp_path / "verl_data").exists()
