"""The calculator as a verl `BaseTool`: the baseline for our agent loop in benchmarks/gpu_step.py.

verl's own `tool_agent` loop calls this in-process (no MCP, no subprocess), with the same arithmetic
and the same result text as our MCP calculator server (envs/servers/calculator.py), so the two loops
differ only in the loop: our `Agent.rollout` + MCP stdio server vs verl's `ToolAgentLoop` + BaseTool.
"""
from __future__ import annotations

from typing import Any
from uuid import uuid4

from verl.tools.base_tool import BaseTool
from verl.tools.schemas import ToolResponse

from envs.servers.calculator import evaluate, format_number


class CalculatorTool(BaseTool):
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
