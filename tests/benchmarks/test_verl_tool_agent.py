"""The baseline of `gpu_suite.sh compare`: verl's own tool loop gets the same prompt and tool answers as ours."""
import asyncio
import json
from pathlib import Path

import pytest

pytest.importorskip("verl", reason="verl is an extra: bash setup.sh --dev (verl-cpu)")

ROOT = Path(__file__).resolve().parents[2]


def test_verls_tool_renders_our_servers_schema_and_answers_like_it():
    from verl.tools.tool_registry import initialize_tools_from_config

    from envs import ToolEnv
    from rl_factory.types import ToolCall

    (tool,) = initialize_tools_from_config(str(ROOT / "benchmarks" / "verl_tool_agent" / "tool_config.yaml"))

    async def ours():
        async with ToolEnv.from_manifest(ROOT / "configs" / "tools" / "calculator.yaml") as env:
            schemas = await env.list_tools()
            results = [await env.call(ToolCall("calculator", {"expression": e})) for e in ("347 * 29", "2 +")]
            return schemas, [r.text for r in results]

    schemas, texts = asyncio.run(ours())
    # what verl's ToolAgentLoop puts in the prompt (tool_agent_loop.py: model_dump(exclude_unset, exclude_none))
    dumped = tool.tool_schema.model_dump(exclude_unset=True, exclude_none=True)
    assert json.dumps(dumped) == json.dumps(schemas[0])  # same keys, same order: the same prompt text
    assert "title" in json.dumps(dumped)  # what verl's own schema model would have dropped

    async def theirs():
        out = []
        for expression in ("347 * 29", "2 +"):
            instance, _ = await tool.create()
            response, _, _ = await tool.execute(instance, {"expression": expression})
            out.append(response.text)
        return out

    answers = asyncio.run(theirs())
    assert answers[0] == texts[0] == "10063"
    assert answers[1].startswith("Error") and "invalid expression" in answers[1] and "invalid expression" in texts[1]
