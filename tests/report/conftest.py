"""A run directory written by the project's own writers (Tracker, write_rollouts, GroupArena), no model."""
import asyncio
import json

import pytest

from rl_factory.group_arena import ArenaConfig, GroupArena
from rl_factory.evaluate import summarize, write_rollouts
from rl_factory.tracking import Tracker
from rl_factory.types import Group, ToolCall, ToolResult, Trajectory, Turn


def make_traj(index, answer, reward, call=None, error_kind=None, stop="answer"):
    """A two-turn tool trajectory (or a one-turn answer when `call` is None), as a rollout leaves it."""
    messages = [{"role": "user", "content": f"What is {index} + 1?"}]
    turns = []
    if call is not None:
        tool_call = ToolCall(call, {"expression": f"{index} + 1"} if error_kind != "parse" else None,
                             error="invalid JSON" if error_kind == "parse" else None)
        result = ToolResult(tool_call, "Error: boom" if error_kind else str(index + 1), error_kind, server="calc",
                            latency_s=0.01)
        messages += [{"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": call, "arguments": tool_call.arguments or "{bad"}}]},
            {"role": "tool", "content": result.text}]
        turns.append(Turn([1, 2], [0.0, 0.0], "<tool_call>...</tool_call>", [tool_call], [result], [3]))
    messages.append({"role": "assistant", "content": f"The answer is {answer}."})
    turns.append(Turn([4, 5], [0.0, 0.0], f"The answer is {answer}."))
    return Trajectory(sample_index=index, prompt_ids=[0], token_ids=[0, 1, 2, 3, 4, 5], loss_mask=[0, 1, 1, 0, 1, 1],
                      logprobs=[0.0] * 6, messages=messages, turns=turns, stop_reason=stop,
                      sample={"answer": str(index + 1), "id": f"q{index}", "data_source": "calc" if index % 2 else "mix"},
                      reward=reward, reward_info={"correct": reward}, advantage=reward - 0.5)


def reward(completion, answer, **_):
    return 1.0 if answer in completion else 0.0


def step_groups(step):
    """Two prompts x 4 rollouts; later steps answer correctly more often."""
    groups = []
    for index in (step * 10, step * 10 + 1):
        right = str(index + 1)
        trajs = [make_traj(index, right if k < step else "0", 1.0 if k < step else 0.0,
                           call="calculator" if k % 2 == 0 else None,
                           error_kind="timeout" if k == 2 else None) for k in range(4)]
        groups.append(Group(index, trajs))
    return groups


@pytest.fixture
def arena_run(tmp_path):
    """Three logged steps of an arena run: metrics.jsonl, rollouts, rankings.csv and matches.csv."""
    run = tmp_path / "arena_run"
    run.mkdir()
    arena = GroupArena(ArenaConfig(topology="round_robin"), reward)
    arena.start(run)
    with Tracker(run, ["jsonl"]) as tracker:
        for step in (1, 2, 3):
            groups = step_groups(step)
            trajs = [t for g in groups for t in g.trajectories]
            _, arena_metrics = asyncio.run(arena.score_groups(groups, step=step))
            metrics = {**summarize(trajs), **arena_metrics, "timing/rollout_s": 1.0 + step, "timing/update_s": 0.5,
                       "timing/step_s": 2.0 + step, "tool/calculator/calls": 4.0, "tool/calculator/errors/timeout": 2.0,
                       "tool/errors/timeout": 2.0, "actor/kl": 0.01 * step, "actor/clip_fraction": 0.1}
            if step in (1, 3):
                metrics.update({"val/accuracy": step / 4, "val/reward/mean": step / 4})
                write_rollouts(run / "rollouts" / f"val_step_{step:06d}.jsonl", trajs[:2])
            write_rollouts(run / "rollouts" / f"step_{step:06d}.jsonl", trajs)
            tracker.log(metrics, step=step)
    (run / "config.yaml").write_text("rollout:\n  n: 4\nalgorithm:\n  advantage: arena\n")
    (run / "run.json").write_text(json.dumps({"run_id": "abc123"}))
    return run
