"""The travel example: its tools through the real tool env, its data, its reward and its judge prompt."""
import asyncio

import pytest

from envs import ToolEnv
from examples.travel.prepare_data import make_rows
from examples.travel.reward import reward
from rewards.judge import Candidate, load_prompt, parse_verdict, render_prompt
from rl_factory.types import ToolCall

ROOT = __import__("pathlib").Path(__file__).resolve().parents[2] / "examples" / "travel"


def test_tools_through_the_manifest():
    async def run():
        async with ToolEnv.from_manifest(ROOT / "tools.yaml") as env:
            names = [t["function"]["name"] if "function" in t else t["name"] for t in await env.list_tools()]
            results = await env.call_batch([
                ToolCall("search_poi", {"city": "Kelport", "category": "park"}),
                ToolCall("route", {"city": "Kelport", "origin": "Gullcliff Park",
                                   "destination": "Kelport Lighthouse", "mode": "walk"}),
                ToolCall("search_poi", {"city": "Atlantis", "category": "park"}),
            ])
        return names, results

    names, results = asyncio.run(run())
    assert sorted(names) == ["route", "search_poi"]
    assert results[0].ok and results[0].text.splitlines()[0].startswith("Fern Valley Botanic Garden | rating 4.8")
    assert results[1].ok and results[1].text == "Gullcliff Park -> Kelport Lighthouse by walk: 3.5 km, about 47 min"
    assert not results[2].ok and "unknown city 'Atlantis'" in results[2].text


def test_rows_and_reward():
    rows = make_rows()
    assert len(rows) == 3 * 12 * 4 and len({r["prompt"] for r in rows}) == len(rows)
    row = rows[0]
    calls = [{"name": "search_poi", "arguments": {"city": row["city"], "category": c}} for c in row["categories"]]
    calls.append({"name": "route", "arguments": {"city": row["city"], "origin": "x", "destination": "y",
                                                 "mode": row["mode"]}})
    perfect = reward(row["answer"], calls, row["city"], row["categories"], row["mode"])
    assert perfect == {"score": pytest.approx(1.0), "coverage": 1.0, "searched": 1.0, "routed": 1.0}
    lazy = reward("Go to the beach.", [], row["city"], row["categories"], row["mode"])
    assert lazy["score"] == 0.0


def test_judge_prompt_renders_and_its_reply_format_parses():
    template = load_prompt(str(ROOT / "judge_prompt.txt"))
    prompt = render_prompt(template, "Plan a day", Candidate("plan A", path="Step 1:\n  call search_poi(...)"),
                           Candidate("plan B"))
    assert "plan A" in prompt and "plan B" in prompt and "call search_poi" in prompt and "{query}" not in prompt
    assert parse_verdict('{"reason": "r", "combined_scores": {"Agent_A": 7.2, "Agent_B": 5.0}, "winner": "A"}') == 1.0
