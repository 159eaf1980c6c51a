"""Fixtures of the rollout-pipeline tests: real rollouts with a scripted model and real MCP servers.

`PlanEngine` plays, per question, a list of trajectory plans (each a list of assistant turns), one plan
per trajectory of the group in the order the trajectories start; the first turn of a plan with several
turns begins with a marker "(a) ", "(b) ", ... so its later turns are told apart by the history. Every token gets a
distinct log-prob and every generation is recorded per trajectory, so tests can compare the ids of a
training sample with the engine's. Tools: the real calculator server and the fault server (whose
`hang` tool times out after 0.5 s: a tool failure that is not the model's fault).

Helpers are handed out as fixtures, as in tests/envs.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from envs import ToolEnv, get_parser
from rl_factory.chat import ChatFormat
from rl_factory.engines.base import Generation
from rl_factory.rollout import Agent, RolloutConfig

ROOT = Path(__file__).resolve().parents[2]
CALL = '<tool_call>\n{{"name": "calculator", "arguments": {{"expression": "{expr}"}}}}\n</tool_call>'
HANG = '<tool_call>\n{"name": "hang", "arguments": {}}\n</tool_call>'
BROKEN = '<tool_call>\n{"name": "calculator", "arguments": {"expression": </tool_call>'
MARKER = re.compile(r"\(([a-z])\) ")


@pytest.fixture(scope="module")
async def env():
    manifest = {"mcpServers": {
        "calculator": {"command": "python", "args": ["-m", "envs.servers.calculator"]},
        "faulty": {"command": "python", "args": [str(ROOT / "tests" / "fakes" / "fault_server.py")],
                   "timeout_s": 0.5, "tools": {"include": ["hang"]}},
    }}
    async with ToolEnv.from_manifest(manifest) as tool_env:
        await tool_env.list_tools()
        yield tool_env


class PlanEngine:
    """Scripted generation by plan (module docstring). `plans[question][j]` = trajectory j's turns."""

    def __init__(self, tokenizer, plans: dict[str, list[list[str]]]):
        self.tokenizer, self.plans = tokenizer, plans
        self.started: dict[str, int] = {}
        self.returned: dict[tuple[str, int], list[list[int]]] = {}  # (question, j) -> ids of each turn

    async def generate(self, prompt_ids, params) -> Generation:
        text = self.tokenizer.decode(prompt_ids)
        question = next(q for q in self.plans if q in text)
        markers = MARKER.findall(text.split(question, 1)[1])
        if markers:
            j = ord(markers[0]) - ord("a")
        else:
            j = self.started.get(question, 0)
            self.started[question] = j + 1
        turns = self.returned.setdefault((question, j), [])
        plan = self.plans[question][j % len(self.plans[question])]
        marker = f"({chr(ord('a') + j)}) " if not turns and len(plan) > 1 else ""
        turn_text = marker + plan[len(turns)]
        ids = self.tokenizer.encode(turn_text, add_special_tokens=False) + [self.tokenizer.eos_token_id]
        finish = "stop"
        if len(ids) > params.max_new_tokens:
            ids, finish = ids[:params.max_new_tokens], "length"
        first = 1000 * len(self.returned) + 100 * len(turns)
        turns.append(ids)
        return Generation(ids, [-(first + k + 1) / 1e4 for k in range(len(ids))], finish)

    async def close(self) -> None:
        return None


@pytest.fixture()
def make_agent(tokenizer, env):
    """make_agent(plans, **rollout_cfg) -> (Agent, PlanEngine)."""
    def make(plans, **cfg):
        engine = PlanEngine(tokenizer, plans)
        config = RolloutConfig(**{"max_turns": 3, "max_response_tokens": 64, "max_total_tokens": 512, **cfg})
        return Agent(engine, env, ChatFormat(tokenizer, env.tools), get_parser("hermes"), config), engine
    return make


def row(question: str, answer: str, **columns) -> dict:
    return {"prompt": question, "answer": answer, "messages": [{"role": "user", "content": question}], **columns}
