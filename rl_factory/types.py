"""The data types under their public name: users' scripts import `rl_factory.types`. They are defined in
the bottom layer (`rl_factory.base.types`), which the project's own modules import."""
from rl_factory.base.types import EPISODE_FAILED, Group, Step, ToolCall, ToolResult, Trajectory, Turn

__all__ = ["EPISODE_FAILED", "Group", "Step", "ToolCall", "ToolResult", "Trajectory", "Turn"]
