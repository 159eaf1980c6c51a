"""Files written from model or tool text survive text that is not Unicode: a lone surrogate (a Python
tool's undecodable bytes, kept by the rollouts writer as its JSON escape) must not fail the write.
(Rollouts: tests/envs/test_tool_limits.py, tests/backends/test_verl_run_dir.py; report.html:
tests/report/test_report.py.) And no reader splits JSON lines where such text may break them."""
import ast
import csv
import os
import re
from pathlib import Path

from rl_factory.rescore import _write
from tests.report.conftest import make_traj


def test_rescore_table_keeps_a_completion_with_a_lone_surrogate(tmp_path):
    traj = make_traj(3, "caf\udce9", 1.0)
    summary = _write(tmp_path, [("train", 1, {"id": "a"})], [traj], [0.0], "mine")
    with (tmp_path / "rescore.csv").open(newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert summary["trajectories"] == 1 and rows[0]["new_reward"] == "1.0"
    assert "caf\\udce9" in rows[0]["completion"]  # escaped, the rest of the text intact


ROOT = Path(__file__).resolve().parents[1]


def python_files(top: str) -> list[Path]:
    """The project's .py files under `top`, without walking installed packages (the test servers' .venv-time and
    node_modules hold tens of thousands of files)."""
    out = []
    for folder, dirs, files in os.walk(ROOT / top):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in ("node_modules", "__pycache__"))
        out += [Path(folder) / f for f in sorted(files) if f.endswith(".py")]
    return out


def splitlines_fed_to_json(tree: ast.AST) -> list[int]:
    """Lines where a loop or comprehension over `<x>.splitlines()` hands its item to `json.loads`."""
    def over_splitlines(node: ast.AST) -> bool:
        return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "splitlines")

    def loads(node: ast.AST) -> bool:
        return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "loads"
                   and isinstance(n.func.value, ast.Name) and n.func.value.id == "json" for n in ast.walk(node))

    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.For) and over_splitlines(node.iter) and any(loads(b) for b in node.body):
            found.append(node.lineno)
        elif isinstance(node, (ast.ListComp, ast.GeneratorExp, ast.SetComp, ast.DictComp)):
            if any(over_splitlines(g.iter) for g in node.generators) and loads(node):
                found.append(node.lineno)
        elif isinstance(node, ast.Call) and loads(node) and any(
                isinstance(n, ast.Subscript) and over_splitlines(n.value) for n in ast.walk(node)):
            found.append(node.lineno)  # json.loads(text.splitlines()[-1])
    return found


def test_no_reader_splits_json_lines_with_splitlines():
    # Our writers keep U+2028, U+2029 and U+0085 raw in model text (rl_factory/jsonl.py); splitlines() breaks a
    # record there. A 4B run's rollouts did, and a benchmark's host-CPU section died in json.loads.
    offenders = []
    for top in ("rl_factory", "benchmarks", "docsgen", "examples"):
        for path in python_files(top):
            for line in splitlines_fed_to_json(ast.parse(path.read_text(encoding="utf-8"))):
                offenders.append(f"{path.relative_to(ROOT)}:{line}")
    assert offenders == [], f"split with rl_factory.jsonl.read_lines/read_records instead: {offenders}"


def splitlines_of_model_text(source: str) -> list[int]:
    """Lines where `.splitlines()` splits what is read from a rollouts or trajectories file (model text)."""
    return [node.lineno for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "splitlines"
            and re.search(r"rollouts|trajectories", ast.get_source_segment(source, node.func.value) or "")]


def test_no_test_splits_model_text_with_splitlines():
    # the tiny model's byte-level tokenizer can write any character: a test reading its rollouts that way could
    # fail on the rare run whose text holds one (tests/records.py reads them)
    offenders = [f"{path.relative_to(ROOT)}:{line}" for path in python_files("tests")
                 for line in splitlines_of_model_text(path.read_text(encoding="utf-8"))]
    assert offenders == [], f"read with tests.records.jsonl instead: {offenders}"
    assert splitlines_of_model_text('x = (run / "rollouts" / "step_000001.jsonl").read_text().splitlines()') == [1]
    assert splitlines_of_model_text('x = (run / "metrics.jsonl").read_text().splitlines()') == []


def test_the_check_finds_each_shape_of_the_mistake():
    shapes = ["[json.loads(x) for x in p.read_text().splitlines()]",
              "for line in text.splitlines():\n    row = json.loads(line)",
              "json.loads(out.strip().splitlines()[-1])"]
    assert [len(splitlines_fed_to_json(ast.parse(code))) for code in shapes] == [1, 1, 1]
    assert splitlines_fed_to_json(ast.parse("[json.loads(x) for x in read_lines(p)]")) == []
