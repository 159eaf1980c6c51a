"""The calculator as a verl `BaseTool`: the baseline for our agent loop in benchmarks/gpu_step.py.

verl's own `tool_agent` loop calls this in-process (no MCP, no subprocess), with the same arithmetic
and the same result text as our MCP calculator server (envs/servers/calculator.py), so the two loops
differ only in the loop: our `Agent.rollout` + MCP stdio server vs verl's `ToolAgentLoop` + BaseTool.

The prompt is the same too: verl's schema model keeps only a parameter's type, description and enum, so
its prompt would lose the titles our MCP server declares (and the builtin tiny model, warm-started on our
prompt, would not call the tool). The tool asks our server for its schema once and shows that one.
"""
from __future__ import annotations

import asyncio
import copy
import threading
from pathlib import Path
from typing import Any
from uuid import uuid4

from pydantic import PrivateAttr
from verl.tools.base_tool import BaseTool
from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse

from envs.servers.calculator import evaluate, format_number

MANIFEST = Path(__file__).resolve().parents[2] / "configs" / "tools" / "calculator.yaml"


class ServerSchema(OpenAIFunctionToolSchema):
    """verl's schema object whose dump (what verl's loop renders into the prompt) is the server's schema as declared."""

    _declared: dict = PrivateAttr(default_factory=dict)

    @classmethod
    def of(cls, declared: dict) -> "ServerSchema":
        schema = cls.model_validate(declared)
        schema._declared = declared
        return schema

    def model_dump(self, *args: Any, **kwargs: Any) -> dict:
        return copy.deepcopy(self._declared)


def server_schema(name: str = "calculator") -> dict:
    """The tool's schema as our agent loop puts it in the prompt: listed by the real MCP server (a thread of its
    own, since verl builds tools inside a running event loop)."""
    from envs import ToolEnv

    async def listed() -> list[dict]:
        async with ToolEnv.from_manifest(MANIFEST) as env:
            return await env.list_tools()

    found: list = []
    thread = threading.Thread(target=lambda: found.append(asyncio.run(listed())))
    thread.start()
    thread.join()
    return next(s for s in found[0] if s["function"]["name"] == name)


class CalculatorTool(BaseTool):
    def __init__(self, config: dict, tool_schema: OpenAIFunctionToolSchema | None = None):
        super().__init__(config, ServerSchema.of(server_schema()))

    async def create(self, instance_id: str | None = None, **kwargs: Any) -> tuple[str, ToolResponse]:
        return instance_id or str(uuid4()), ToolResponse()

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs: Any
                      ) -> tuple[ToolResponse, float, dict]:
        try:
            text = format_number(evaluate(str(parameters.get("expression", ""))))
        except Exception as exc:  # noqa: BLE001 - the model sees the error, as with our server
            text = f"Error: {exc}"
        return ToolResponse(text=text), 0.0, {}

    async def release(self, instance_id: str, **kwargs: Any) -> None:
        return None
