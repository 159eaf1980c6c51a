"""GroupArena: the training-side glue (candidates, concurrent tournaments, rankings.csv, arena/* metrics)."""
import asyncio
import csv

import pytest

from rl_factory.group_arena import ArenaConfig, GroupArena
from rl_factory.types import Group, Trajectory
from rewards.judge import JudgeConfig


def traj(index, answer, reward=None, calls=0):
    messages = [{"role": "user", "content": f"question {index}"}]
    for _ in range(calls):
        messages.append({"role": "assistant", "content": "",
                         "tool_calls": [{"type": "function", "function": {"name": "calc", "arguments": {"x": 1}}}]})
        messages.append({"role": "tool", "content": "1"})
    messages.append({"role": "assistant", "content": answer})
    return Trajectory(sample_index=index, prompt_ids=[], token_ids=[], loss_mask=[], logprobs=[], messages=messages,
                      turns=[], stop_reason="answer", sample={"prompt": f"question {index}", "answer": "4"},
                      reward=reward)


def reward(completion, answer, **_):
    return 1.0 if completion.strip() == answer else 0.0


def groups():
    return [Group(11, [traj(11, a, r) for a, r in [("4", 1.0), ("5", 0.0), ("4", 1.0), ("x", 0.0)]]),
            Group(12, [traj(12, a, 0.0) for a in ("1", "2", "3", "5")])]


def test_score_groups_writes_rankings_and_metrics(tmp_path):
    arena = GroupArena(ArenaConfig(topology="round_robin"), reward)
    arena.start(tmp_path)
    scores, metrics = asyncio.run(arena.score_groups(groups(), step=1))
    assert scores[:4] == pytest.approx([5 / 6, 1 / 6, 5 / 6, 1 / 6]) and scores[4:] == [0.5] * 4
    assert metrics == {"arena/judge_calls": 12.0, "arena/ties": 2.0 + 6.0, "arena/judge_failures": 0.0,
                       "arena/skipped_groups": 0.0, "arena/reward_spearman": pytest.approx(1.0),
                       "arena/judge_requests": 0.0}
    rows = list(csv.DictReader((tmp_path / "rankings.csv").open()))
    assert rows[0] == {"step": "1", "group": "0", "prompt": "11", "rollout": "0", "matches": "3", "wins": "2",
                       "losses": "0", "rank": "1", "score": "0.833333"}
    assert len(rows) == 8


def test_resume_drops_the_rankings_of_replayed_steps(tmp_path):
    arena = GroupArena(ArenaConfig(topology="anchor"), reward)
    arena.start(tmp_path)
    for step in (1, 2, 3):
        asyncio.run(arena.score_groups(groups(), step=step))
    GroupArena(ArenaConfig(topology="anchor"), reward).start(tmp_path, resume_step=3)
    rows = list(csv.DictReader((tmp_path / "rankings.csv").open()))
    assert sorted({r["step"] for r in rows}) == ["1", "2"] and len(rows) == 16
    GroupArena(ArenaConfig(topology="anchor"), reward).start(tmp_path)  # a fresh run starts over
    assert list(csv.DictReader((tmp_path / "rankings.csv").open())) == []


def test_reference_anchor_is_scored_by_the_reward(tmp_path):
    arena = GroupArena(ArenaConfig(topology="anchor", anchor="reference"), reward)
    scores, metrics = asyncio.run(arena.score_groups(groups(), step=1))
    # Every rollout meets the reference answer "4" (reward 1): the right ones tie it, the others lose.
    assert metrics["arena/judge_calls"] == 8 and scores[:4] == pytest.approx([5 / 6, 1 / 6, 5 / 6, 1 / 6])


def test_greedy_anchor_needs_its_rollouts():
    arena = GroupArena(ArenaConfig(topology="single_elimination", anchor="greedy"), reward)
    assert arena.needs_greedy_anchor
    with pytest.raises(ValueError, match="greedy anchor rollout per group"):
        asyncio.run(arena.score_groups(groups(), step=1))
    anchors = [Group(11, [traj(11, "4", 1.0)]), Group(12, [traj(12, "9", 0.0)])]
    scores, metrics = asyncio.run(arena.score_groups(groups(), step=1, anchors=anchors))
    assert metrics["arena/judge_calls"] == 2 * (4 + 3)
    assert max(scores[:4]) in (scores[0], scores[2])
    assert not GroupArena(ArenaConfig(topology="round_robin", anchor="greedy"), reward).needs_greedy_anchor


@pytest.mark.parametrize("cfg, message", [
    (ArenaConfig(topology="ladder"), "unknown tournament topology 'ladder'"),
    (ArenaConfig(anchor="best"), "unknown arena anchor 'best'"),
    (ArenaConfig(on_judge_failure="ignore"), "unknown on_judge_failure 'ignore'"),
    (ArenaConfig(rounds=3), "rounds is a swiss option"),
    (ArenaConfig(judge=JudgeConfig(type="llm")), "needs judge.model"),
])
def test_config_errors(cfg, message):
    with pytest.raises((KeyError, ValueError), match=message):
        GroupArena(cfg, reward)
