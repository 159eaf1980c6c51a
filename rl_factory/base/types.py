"""The currency between modules: tool calls, tool results, turns, trajectories and groups.

Everything the rollout produces and the trainer, rewards and loggers consume is one of these
dataclasses. They hold plain Python lists (not tensors) so they cross process boundaries (verl
workers) and serialize to the rollout JSONL without conversion.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


# A trajectory whose episode could not open, or whose environment failed: stop_reason and dropped_by.
EPISODE_FAILED = "episode_error"


@dataclass
class ToolCall:
    """One tool call as the model wrote it.

    `arguments` is None when the call text could not be parsed; `error` then says why, and the
    call still flows to the tool env so the model sees the error as a tool message.
    """

    name: str
    arguments: dict[str, Any] | None
    raw: str = ""
    error: str | None = None


@dataclass
class ToolResult:
    """What one call returned, already rendered as the text the model will see.

    `error_kind` is None on success, else one of: "parse", "unknown_tool", "bad_arguments",
    "timeout", "server_error", "crashed". Failures are observations, never exceptions.
    `cached` is True when a tool's result cache answered (no call was made; latency 0).
    """

    call: ToolCall
    text: str
    error_kind: str | None = None
    server: str | None = None
    latency_s: float = 0.0
    cached: bool = False

    @property
    def ok(self) -> bool:
        return self.error_kind is None


@dataclass
class Turn:
    """One assistant turn: the tokens the engine generated and the observation appended after it."""

    generated_ids: list[int]
    logprobs: list[float]
    text: str
    tool_calls: list[ToolCall] = field(default_factory=list)
    tool_results: list[ToolResult] = field(default_factory=list)
    observation_ids: list[int] = field(default_factory=list)
    # The engine's receipt for these ids (Generation.receipt): what the run guard compares the trained ids with
    receipt: dict[str, Any] | None = None
    # [(policy version, tokens), ...] over generated_ids: async training only (rl_factory/asynchrony.py)
    version_spans: list[tuple[int, int]] | None = None


@dataclass
class Step:
    """One training sample cut from a trajectory: a turn of the `step` context policy, or an augmenter's view.

    `token_ids` = the sample's prompt ids (loss_mask 0) + what it trains on (loss_mask 1 on generated ids).
    The trajectory's advantage, times `weight`, applies to every one of its steps.
    """

    token_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]
    advantage: float | None = None
    weight: float = 1.0


@dataclass
class Trajectory:
    """One multi-turn rollout of one prompt.

    `token_ids` is the exact sequence the policy is trained on: prompt ids, then for every turn the
    generated ids (loss_mask 1) and the observation ids (loss_mask 0). `logprobs` are the behaviour
    policy's log-probs recorded at generation, aligned with `token_ids` (0.0 where loss_mask is 0).
    """

    sample_index: int
    prompt_ids: list[int]
    token_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]
    messages: list[dict[str, Any]]
    turns: list[Turn]
    stop_reason: str
    sample: dict[str, Any] = field(default_factory=dict)
    reward: float | None = None
    reward_info: dict[str, Any] = field(default_factory=dict)
    advantage: float | None = None
    steps: list[Step] = field(default_factory=list)  # only with the `step` context policy
    # One process reward per turn (reward.process), placed on the turn's last generated token.
    process_rewards: list[float] = field(default_factory=list)
    # Token-level estimators (gae) only, aligned with token_ids: per-token advantages, the critic's
    # values before the update, and its targets. None on the outcome-estimator path.
    token_advantages: list[float] | None = None
    old_values: list[float] | None = None
    returns: list[float] | None = None
    # The rollout filter that dropped it (rl_factory/pipeline), or EPISODE_FAILED; None = it trains.
    dropped_by: str | None = None
    # What the environment (env.environment) kept: its `state` dict at the end; the reward's `state`.
    state: dict[str, Any] = field(default_factory=dict)

    @property
    def version_spans(self) -> list[tuple[int, int]]:
        """[(policy version, generated tokens), ...] over all turns, adjacent runs of one version merged;
        [] when the engine recorded none (on-policy training)."""
        spans: list[tuple[int, int]] = []
        for turn in self.turns:
            for version, count in turn.version_spans or ():
                if spans and spans[-1][0] == version:
                    spans[-1] = (version, spans[-1][1] + count)
                else:
                    spans.append((version, count))
        return spans

    def training_samples(self) -> list[Trajectory | Step]:
        """What the update trains on: the whole sequence, or each of its steps (step policy, augmenters)."""
        if not self.steps:
            return [self]
        for step in self.steps:
            step.advantage = None if self.advantage is None else self.advantage * step.weight
        return list(self.steps)

    @property
    def completion(self) -> str:
        """The final assistant message: what a reward usually scores."""
        return self.turns[-1].text if self.turns else ""

    @property
    def tool_calls(self) -> list[ToolCall]:
        return [c for t in self.turns for c in t.tool_calls]

    @property
    def tool_results(self) -> list[ToolResult]:
        return [r for t in self.turns for r in t.tool_results]

    @property
    def num_generated_tokens(self) -> int:
        """Tokens the engine generated (views of augmenters may train some of them several times)."""
        return sum(len(t.generated_ids) for t in self.turns)


@dataclass
class Group:
    """The n trajectories sampled for one prompt: the unit of group-relative advantages."""

    sample_index: int
    trajectories: list[Trajectory]
