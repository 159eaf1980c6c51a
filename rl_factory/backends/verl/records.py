"""A trajectory as JSON, so it can travel from verl's agent-loop worker to its reward worker.

verl scores a trajectory in a separate Ray actor (RewardLoopWorker) that sees only the decoded text
and the agent loop's `extra_fields`. Our reward functions want the whole picture (messages, every
tool call and result, the dataset row), so the agent loop puts this record in `extra_fields` as one
JSON string (strings pass through verl's TransferQueue and DataProto untouched) and
`rl_factory.backends.verl.reward` rebuilds the `Trajectory` from it. Token ids of the prompt and
observations are left out (the reward never reads them); generated ids stay, for `num_tokens`.
"""
from __future__ import annotations

import dataclasses
import json
from typing import Any

from rl_factory.base.types import ToolCall, ToolResult, Trajectory, Turn

RECORD_KEY = "rl_factory_trajectory"


def to_record(traj: Trajectory, step: int = 0, split: str = "train", session: int = 0,
              timing: dict[str, float] | None = None, guard: dict[str, Any] | None = None) -> str:
    """The trajectory as JSON, with where it belongs in the run (global step, split, session) and, from
    the agent loop, its `timing` (wall_s from the agent loop's start to its return, generate_s, tools_s,
    started_unix, first_request_unix)
    and the run guard's evidence (`guard`: rl_factory/guard/evidence.py)."""
    turns = [{
        "generated_ids": t.generated_ids, "text": t.text,
        "tool_calls": [dataclasses.asdict(c) for c in t.tool_calls],
        "tool_results": [{**dataclasses.asdict(r), "call": dataclasses.asdict(r.call)} for r in t.tool_results],
    } for t in traj.turns]
    record = {"sample_index": traj.sample_index, "messages": traj.messages, "turns": turns,
              "stop_reason": traj.stop_reason, "sample": traj.sample, "step": step, "split": split,
              "session": session, "prompt_tokens": len(traj.prompt_ids), "total_tokens": len(traj.token_ids)}
    if timing:
        record["timing"] = timing
    if guard:
        record["guard"] = guard
    return json.dumps(record, default=str)


def from_record(text: str | dict[str, Any]) -> Trajectory:
    """The Trajectory of a record (its JSON text, or the text already parsed)."""
    record: dict[str, Any] = json.loads(text) if isinstance(text, str) else text
    turns = []
    for t in record["turns"]:
        results = [ToolResult(**{**r, "call": ToolCall(**r["call"])}) for r in t["tool_results"]]
        turns.append(Turn(generated_ids=t["generated_ids"], logprobs=[], text=t["text"],
                          tool_calls=[ToolCall(**c) for c in t["tool_calls"]], tool_results=results))
    return Trajectory(sample_index=record["sample_index"], prompt_ids=[], token_ids=[], loss_mask=[], logprobs=[],
                      messages=record["messages"], turns=turns, stop_reason=record["stop_reason"],
                      sample=record["sample"])


def rollout_line(record: str | dict[str, Any], traj: Trajectory) -> dict[str, Any]:
    """The rollouts-file line (`trajectory_record`) of a scored trajectory rebuilt by `from_record`.

    The token counts come from the record: the rebuilt trajectory carries no prompt or observation ids.
    """
    from rl_factory.evaluate import trajectory_record

    meta = json.loads(record) if isinstance(record, str) else record
    line = trajectory_record(traj)
    line.update(session=meta.get("session", 0), prompt_tokens=meta.get("prompt_tokens", 0),
                total_tokens=meta.get("total_tokens", 0))
    for key in ("timing", "guard"):
        if meta.get(key):
            line[key] = meta[key]
    return line
