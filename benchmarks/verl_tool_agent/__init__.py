"""verl's own ToolAgentLoop with the calculator as a verl BaseTool: the baseline our agent loop is compared with."""
from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).resolve().parent


def overrides(max_turns: int) -> list[str]:
    """The raw verl keys that run verl's tool_agent loop on the calculator task instead of ours."""
    return ["actor_rollout_ref.rollout.agent.default_agent_loop=tool_agent",
            f"actor_rollout_ref.rollout.multi_turn.tool_config_path={HERE / 'tool_config.yaml'}",
            "actor_rollout_ref.rollout.multi_turn.format=hermes",
            f"actor_rollout_ref.rollout.multi_turn.max_assistant_turns={max_turns}",
            f"reward.custom_reward_function.path={HERE / 'reward.py'}",
            "reward.custom_reward_function.name=compute_score"]
