"""Benchmark results are records: every script appends its line with where and when it was measured, and the
stored records (benchmarks/results/, the benchmarks page's source) all carry that provenance."""
import json
import re
import os
import subprocess
import sys

import pytest

from tests.docs.markdown import REPO

RESULTS = REPO / "benchmarks" / "results"
PROVENANCE = ("benchmark", "date", "commit", "command", "machine")


def _env(**extra):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_CURRENT_TEST", "BENCH_RESULTS_DIR")}
    return {**env, **extra}


def test_a_benchmark_script_prints_its_line_and_appends_its_record(tmp_path):
    command = [sys.executable, "benchmarks/tool_calls.py", "--in-flight", "4", "--latency-s", "0.02", "--rounds", "2",
               "--sequential-calls", "2", "--repeats", "1"]
    done = subprocess.run(command, cwd=REPO, env=_env(BENCH_RESULTS_DIR=str(tmp_path)), capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    printed = json.loads(done.stdout.strip().splitlines()[-1])
    [line] = (tmp_path / "tool_calls.jsonl").read_text().splitlines()
    record = json.loads(line)
    assert {k: record[k] for k in printed if k != "date"} == {k: v for k, v in printed.items() if k != "date"}
    assert record["command"] == (".venv/bin/python " if ".venv" in sys.executable else sys.executable + " ") + \
        "benchmarks/tool_calls.py --in-flight 4 --latency-s 0.02 --rounds 2 --sequential-calls 2 --repeats 1"
    head = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    assert record["commit"].startswith(head)
    assert record["machine"]["cores"] == os.cpu_count() and record["machine"]["cpu"]
    assert "loadavg_1m" in record["machine"] and "T" in record["date"] and record["date"].endswith("+00:00")
    assert not any(os.uname().nodename in json.dumps(v) for v in record["machine"].values())


def test_under_pytest_nothing_is_recorded_unless_a_directory_is_named(tmp_path):
    code = "from benchmarks.record import emit; emit('demo', {'x': 1})"
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=_env(PYTEST_CURRENT_TEST="t", BENCH_RESULTS_DIR=""),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and json.loads(done.stdout) == {"x": 1}
    assert "recorded" not in done.stderr
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=_env(PYTEST_CURRENT_TEST="t"),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "recorded" not in done.stderr and not (RESULTS / "demo.jsonl").exists()


def test_every_script_that_prints_a_result_records_it():
    """A script that prints JSON lines measures something (its `--cfg-job` checks may print theirs plainly); it
    records it with `emit`, or with `append` where the record keeps its own provenance (launches.py's join)."""
    silent = [p.name for p in sorted((REPO / "benchmarks").glob("*.py"))
              if "print(json.dumps(" in p.read_text() and "emit(" not in p.read_text()
              and "append(\"gpu_step\"" not in p.read_text()]
    assert silent == []
    assert "emit(" in (REPO / "benchmarks" / "tool_calls.py").read_text()


RECORDS = [(p.name, n, line) for p in sorted(RESULTS.glob("*.jsonl"))
           for n, line in enumerate(p.read_text().splitlines(), 1) if line.strip()]


def test_there_are_records():
    assert len({name for name, _, _ in RECORDS}) >= 5


@pytest.mark.parametrize("name, number, line", RECORDS, ids=[f"{n}:{i}" for n, i, _ in RECORDS])
def test_each_stored_record_says_where_and_when_it_was_measured(name, number, line):
    record = json.loads(line)
    assert all(record.get(k) for k in PROVENANCE), [k for k in PROVENANCE if not record.get(k)]
    assert f"{record['benchmark']}.jsonl" == name
    # the environment a command needs may lead it (JUDGE_VLLM_ARGS=... bash examples/...)
    command = re.sub(r"^(\w+=\S+ )+", "", record["command"])
    assert command.startswith((".venv/bin/python benchmarks/", "bash benchmarks/", "bash examples/")), record["command"]
    assert record["machine"].get("cpu") and record["machine"].get("cores")
    assert len(record["date"]) >= 10 and record["date"][:4].isdigit()
    if record.get("source"):  # moved from a hand-written table: "<file> at <commit>", a commit of this repository
        commit = record["source"].rsplit(" at ", 1)[1]
        assert subprocess.run(["git", "cat-file", "-e", f"{commit}^{{commit}}"], cwd=REPO).returncode == 0, commit
