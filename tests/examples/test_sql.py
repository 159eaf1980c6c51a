"""The SQL example: databases made by its data script, one server process per episode, its reward.

The scripted "model" runs each sample's reference statement (or nothing); the reward reads the rows back
through the trajectory's own episode. Several trajectories of one sample run at once, so a leak from
one database copy into another (or into the sample's file) would show as a wrong reward.
"""
from __future__ import annotations

import hashlib
import json
import sqlite3
from pathlib import Path

import pytest

from envs import ToolEnv, get_parser
from examples.sql.prepare_data import main as prepare
from rewards.combine import RewardConfig
from rewards.scorer import build_scorer
from rl_factory.chat import ChatFormat
from rl_factory.data import load_dataset
from rl_factory.engines.base import SamplingParams
from rl_factory.engines.scripted import ScriptedEngine
from rl_factory.rollout import Agent, RolloutConfig

pytestmark = pytest.mark.anyio
ROOT = Path(__file__).resolve().parents[2]
SQL = ROOT / "examples" / "sql"
CALL = '<tool_call>\n{{"name": "run_sql", "arguments": {{"sql": "{sql}"}}}}\n</tool_call>'


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    out = tmp_path_factory.mktemp("sql")
    prepare(["--out-dir", str(out), "--n-train", "6", "--n-val", "2"])
    return out


def digest(path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def test_every_sample_has_its_own_real_sqlite_database(data, tmp_path):
    rows = [json.loads(line) for line in (data / "train.jsonl").read_text().splitlines()]
    assert len({r["db_path"] for r in rows}) == 6 and {r["kind"] for r in rows} == {"insert", "update"}
    for row in rows:
        with sqlite3.connect(row["db_path"]) as conn:  # a real database file
            (before,) = conn.execute(row["check_sql"]).fetchone()
        assert before != row["expected"]  # the task changes something
    prepare(["--out-dir", str(tmp_path), "--n-train", "6", "--n-val", "2"])  # seeded: the same samples again
    again = [json.loads(line) for line in (tmp_path / "train.jsonl").read_text().splitlines()]
    assert [(r["prompt"], r["expected"]) for r in again] == [(r["prompt"], r["expected"]) for r in rows]


@pytest.mark.slow  # per-episode database copies and servers (~8 s)
async def test_the_reward_reads_each_trajectorys_own_copy(data, tokenizer):
    rows = load_dataset(data / "train.jsonl")[:2]
    files = {r["db_path"]: digest(r["db_path"]) for r in rows}
    started: dict[str, int] = {}

    def script(prompt_ids, turn):
        """Per sample, the first trajectory runs the reference statement, the others only look."""
        text = tokenizer.decode(prompt_ids)
        row = next(r for r in rows if r["prompt"] in text)
        if turn:
            return "Done."
        k = started[row["id"]] = started.get(row["id"], -1) + 1
        sql = row["reference_sql"] if k == 0 else f"SELECT * FROM {row['table']}"
        return CALL.format(sql=sql)

    scorer = build_scorer(RewardConfig(function=str(SQL / "reward.py") + ":reward"))
    async with ToolEnv.from_manifest(SQL / "tools.yaml") as env:
        tools = await env.list_tools()
        assert [t["function"]["name"] for t in tools] == ["run_sql"]
        assert list(tools[0]["function"]["parameters"]["properties"]) == ["sql"]  # the database is hidden
        agent = Agent(ScriptedEngine(tokenizer, script), env, ChatFormat(tokenizer, tools), get_parser("hermes"),
                      RolloutConfig(max_turns=2, max_response_tokens=256, max_total_tokens=1024))
        groups = await agent.rollout_groups(rows, [0, 1], 3, SamplingParams(1.0, 1.0, 64), scorer=scorer)
        metrics = await scorer.wait([t for g in groups for t in g.trajectories])
        assert not env._episodes and env.metrics()["episode/opened"] == 6
    for group in groups:
        by_writer = sorted(group.trajectories, key=lambda t: "SELECT" in t.tool_calls[0].arguments["sql"])
        assert [t.reward for t in by_writer] == [1.0, 0.0, 0.0]  # only the writer's own copy changed
        assert [t.reward_info["wrote"] for t in by_writer] == [1.0, 0.0, 0.0]
        # every check reached its copy (a sync tool ran in another thread than its sqlite connection: 1 in 5 failed)
        assert [t.reward_info["check_failed"] for t in by_writer] == [0.0, 0.0, 0.0]
        assert by_writer[0].tool_results[0].text == "OK, 1 row(s) changed"
    assert metrics["reward/tool_calls"] == 6.0
    assert {p: digest(p) for p in files} == files  # the samples' files are as the data script wrote them


def test_two_training_steps_on_the_embedded_default(data, two_steps):
    lines = two_steps(f"env.tools={SQL / 'tools.yaml'}", f"data.train_files={data / 'train.jsonl'}",
                      f"data.val_files={data / 'val.jsonl'}", f"reward.function={SQL / 'reward.py'}:reward")
    assert [m["step"] for m in lines] == [0, 1, 2]
    for m in lines[1:]:
        # every trajectory had its own episode; the reward read its rows through it (one call each)
        assert m["episode/opened"] == 4 and m["reward/tool_calls"] == 4 and m.get("episode/failed", 0) == 0
    assert lines[0]["val/reward/tool_calls"] == 2


@pytest.mark.slow  # waits out a statement's time limit
async def test_a_runaway_statement_is_stopped_and_a_huge_value_refused(data):
    from rl_factory.types import ToolCall

    row = load_dataset(data / "train.jsonl")[0]
    async with ToolEnv.from_manifest(SQL / "tools.yaml") as env:
        await env.list_tools()
        async with env.episode(row) as episode:
            forever = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c"
            blob = "SELECT length(randomblob(900000000))"
            endless, huge, fine = await episode.call_batch([ToolCall("run_sql", {"sql": forever}),
                                                            ToolCall("run_sql", {"sql": blob}),
                                                            ToolCall("run_sql", {"sql": "SELECT 1 + 1"})])
    # the server answered each (its call timeout is 10 s, the statement limit 5 s): it was not wedged
    assert not endless.ok and "ran past 5 s and was stopped" in endless.text, endless.text
    assert not huge.ok and "too big" in huge.text, huge.text
    assert fine.ok and fine.text.splitlines()[-1] == "2"
