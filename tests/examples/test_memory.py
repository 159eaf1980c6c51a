"""The memory example: a stateful server nobody here wrote (npm's server-memory), one per episode.

The isolation test runs two trajectories at once: one stores a fact, the other reads the whole graph a
moment later. With `scope: episode` the reader finds nothing; the same manifest with `scope: shared` (one
process and one graph file for everyone) lets it read the other's memory, which shows the test can fail.
Per-episode processes and `${episode.dir}` directories are looked for in /proc and on disk afterwards.
"""
from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
import yaml

from envs import ToolEnv, get_parser
from rewards.combine import RewardConfig
from rewards.scorer import build_scorer
from rl_factory.chat import ChatFormat
from rl_factory.engines.base import SamplingParams
from rl_factory.engines.scripted import ScriptedEngine
from rl_factory.rollout import Agent, RolloutConfig
from tests.envs.test_real_servers import SERVERS

pytestmark = pytest.mark.anyio
ROOT = Path(__file__).resolve().parents[2]
MEMORY = ROOT / "examples" / "memory"
STORE = ('<tool_call>\n{"name": "create_entities", "arguments": {"entities": [{"name": "Ada Quill", "entityType": '
         '"person", "observations": ["plays the cello"]}]}}\n</tool_call>')
READ = '<tool_call>\n{"name": "read_graph", "arguments": {}}\n</tool_call>'
ROWS = [{"messages": [{"role": "user", "content": "Remember this: Ada Quill plays the cello."}],
         "person": "Ada Quill", "fact": "plays the cello"},
        {"messages": [{"role": "user", "content": "What do you remember?"}], "person": "Nobody", "fact": "-"}]


@pytest.fixture(scope="module")
def installed():
    if not (SERVERS / "node_modules" / "@modelcontextprotocol" / "server-memory").is_dir():
        pytest.fail("server-memory is not installed: bash tests/servers/install.sh")


def manifest(scope: str) -> dict:
    spec = yaml.safe_load((MEMORY / "tools.yaml").read_text())
    spec["mcpServers"]["memory"]["scope"] = scope
    if scope == "shared":  # one file for the run; ${episode.dir} belongs to episodes
        spec["mcpServers"]["memory"]["env"]["MEMORY_FILE_PATH"] = str(Path(tempfile.mkdtemp()) / "memory.jsonl")
    return spec


def node_processes(directory: str) -> list[int]:
    """Live processes whose environment names `directory` (the memory servers of these episodes)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and directory.encode() in (proc / "environ").read_bytes():
                found.append(int(proc.name))
        except OSError:
            continue
    return found


async def roll_out(tokenizer, scope: str):
    def script(prompt_ids, turn):
        storing = "Ada Quill plays" in tokenizer.decode(prompt_ids)
        return "Done." if turn else STORE if storing else READ

    def delay(prompt_ids, turn):  # the reader reads once the writer has written
        return 0.0 if turn or "Ada Quill plays" in tokenizer.decode(prompt_ids) else 1.5

    scorer = build_scorer(RewardConfig(function=str(MEMORY / "reward.py") + ":reward"))
    async with ToolEnv.from_manifest(manifest(scope)) as env:
        tools = await env.list_tools()
        agent = Agent(ScriptedEngine(tokenizer, script, delay_s=delay), env, ChatFormat(tokenizer, tools),
                      get_parser("hermes"), RolloutConfig(max_turns=2, max_response_tokens=256, max_total_tokens=2048))
        groups = await agent.rollout_groups(ROWS, [0, 1], 1, SamplingParams(1.0, 1.0, 256), scorer=scorer)
        await scorer.wait([g.trajectories[0] for g in groups])
    return [g.trajectories[0] for g in groups]


async def test_trajectories_cannot_see_each_others_memory(installed, tokenizer, tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where ${episode.dir} directories are made
    writer, reader = await roll_out(tokenizer, "episode")
    assert writer.tool_results[0].ok and writer.reward == 1.0  # its own graph holds the fact
    graph = json.loads(reader.tool_results[0].text)
    assert graph == {"entities": [], "relations": []}  # the other episode's memory is not there
    assert list(tmp_path.iterdir()) == [] and node_processes(str(tmp_path)) == []  # dirs removed, servers gone

    writer, reader = await roll_out(tokenizer, "shared")  # the control: one server for both
    assert "Ada Quill" in reader.tool_results[0].text


def test_two_training_steps_on_the_embedded_default(installed, two_steps, tmp_path):
    from examples.memory.prepare_data import main as prepare

    prepare(["--out-dir", str(tmp_path / "data"), "--n-train", "4", "--n-val", "2"])
    lines = two_steps(f"env.tools={MEMORY / 'tools.yaml'}", f"data.train_files={tmp_path / 'data' / 'train.jsonl'}",
                      f"data.val_files={tmp_path / 'data' / 'val.jsonl'}",
                      f"reward.function={MEMORY / 'reward.py'}:reward")
    assert [m["step"] for m in lines] == [0, 1, 2]
    for m in lines[1:]:
        assert m["episode/opened"] == 4 and "reward/mean" in m and m.get("episode/failed", 0) == 0


def test_main_eval_scores_each_row_in_its_episode(installed, tiny_model_dir, tmp_path):
    """evaluate (main_eval.sh's code) opens an episode per trajectory and scores it there."""
    from rl_factory.config import load_config
    from rl_factory.evaluate_cli import run_eval

    cfg = load_config("eval", [f"model.path={tiny_model_dir}", "model.device=cpu", f"env.tools={MEMORY / 'tools.yaml'}",
                               f"eval.files={MEMORY / 'data' / 'val.jsonl'}", "eval.limit=2", "env.max_turns=2",
                               f"reward.function={MEMORY / 'reward.py'}:reward", f"eval.output_dir={tmp_path}",
                               "rollout.max_response_tokens=32", "eval.progress=false"])
    result = run_eval(cfg)
    metrics = result["metrics"]
    assert metrics["reward/tool_calls"] == 2  # the reward asked each trajectory's own memory server
    assert metrics.get("episode/dropped", 0) == 0 and len(result["per_row"]) == 2
