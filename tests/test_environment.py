"""The speaking environment (`env.environment`) and episodes in the rollout, the reward and the pipeline.

A scripted model plays against small environments defined here, with the tiny model's real tokenizer and
chat template, the real calculator server and (per episode) tests/fakes/notes_server.py. Expected token
ids come from `apply_chat_template` and literal template text, not from ChatFormat.
"""
from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path

import pytest

from envs import ToolEnv, get_parser
from envs.environment import load_environment
from envs.episode import EpisodeError
from rl_factory.algorithms.advantages import assign_advantages
from rl_factory.chat import ChatFormat
from rl_factory.components import EnvConfig, open_env
from rl_factory.config import ConfigError
from rl_factory.data import PromptSampler
from rl_factory.engines.base import SamplingParams
from rl_factory.engines.scripted import ScriptedEngine
from rl_factory.evaluate import summarize
from rl_factory.pipeline import PipelineConfig, RolloutPipeline
from rl_factory.rollout import Agent, RolloutConfig
from rl_factory.types import EPISODE_FAILED
from rewards.loader import RewardFn
from rewards.scorer import Scorer

pytestmark = pytest.mark.anyio
ROOT = Path(__file__).resolve().parents[1]
NOTES = str(ROOT / "tests" / "fakes" / "notes_server.py")
GREEDY = SamplingParams(temperature=0.0, max_new_tokens=64)
PLAY = [{"role": "user", "content": "Let's play."}]
CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "347 * 29"}}\n</tool_call>'


class Guess:
    """Higher / lower until the guess is the target; the state says how it went."""

    def __init__(self, target: int = 75):
        self.target = target

    async def reset(self, sample):
        self.state = {"target": sample.get("target", self.target), "guesses": [], "solved": False}
        return [{"role": "user", "content": "Guess my number."}]

    async def step(self, trajectory):
        guess = int(trajectory.turns[-1].text.split()[-1])
        self.state["guesses"].append(guess)
        if guess == self.state["target"]:
            self.state["solved"] = True
            return [], True
        return [{"role": "user", "content": "higher" if guess < self.state["target"] else "lower"}], False

    async def close(self):
        self.closed = True


def agent_for(tokenizer, env, script, **cfg):
    config = RolloutConfig(**{"max_turns": 3, "max_response_tokens": 64, "max_total_tokens": 512, **cfg})
    engine = ScriptedEngine(tokenizer, script)
    return Agent(engine, env, ChatFormat(tokenizer, env.tools), get_parser("hermes"), config), engine


def ids(tokenizer, text):
    return tokenizer.encode(text, add_special_tokens=False)


async def test_a_speaking_environment_is_token_faithful(tokenizer):
    async with ToolEnv.empty() as env:
        env.environment = load_environment(Guess)
        agent, _ = agent_for(tokenizer, env, ["I guess 50", "I guess 75"])
        traj = await agent.rollout({"messages": PLAY}, 0, GREEDY)
    eos = tokenizer.eos_token_id
    # reset's message is part of the prompt, rendered once with the dataset's
    prompt = ids(tokenizer, tokenizer.apply_chat_template(PLAY + [{"role": "user", "content": "Guess my number."}],
                                                          tokenize=False, add_generation_prompt=True))
    turn1, turn2 = ids(tokenizer, "I guess 50") + [eos], ids(tokenizer, "I guess 75") + [eos]
    spoken = ids(tokenizer, "\n<|im_start|>user\nhigher<|im_end|>\n<|im_start|>assistant\n")
    assert traj.prompt_ids == prompt
    assert traj.token_ids == prompt + turn1 + spoken + turn2  # the answer is appended, never re-rendered
    assert traj.loss_mask == [0] * len(prompt) + [1] * len(turn1) + [0] * len(spoken) + [1] * len(turn2)
    assert traj.stop_reason == "env_done" and traj.turns[0].observation_ids == spoken
    assert traj.state == {"target": 75, "guesses": [50, 75], "solved": True}
    assert [m["role"] for m in traj.messages] == ["user", "user", "assistant", "user", "assistant"]


async def test_the_environment_answers_after_the_tool_results_in_one_observation(tokenizer):
    class Coach(Guess):
        async def reset(self, sample):
            self.state = {}
            return []

        async def step(self, trajectory):
            turn = trajectory.turns[-1]
            if turn.tool_calls:  # it sees the tool results already appended
                assert trajectory.messages[-1] == {"role": "tool", "content": "10063"}
                return [{"role": "user", "content": "Now say it."}], False
            return [], True

    async with ToolEnv.from_manifest(ROOT / "configs" / "tools" / "calculator.yaml") as env:
        await env.list_tools()
        env.environment = load_environment(Coach)
        agent, _ = agent_for(tokenizer, env, [CALL, "10063"])
        traj = await agent.rollout({"messages": PLAY}, 0, GREEDY)
    observation = ids(tokenizer, "\n<|im_start|>user\n<tool_response>\n10063\n</tool_response><|im_end|>\n"
                                 "<|im_start|>user\nNow say it.<|im_end|>\n<|im_start|>assistant\n")
    assert traj.turns[0].observation_ids == observation and traj.stop_reason == "env_done"
    n1 = len(traj.turns[0].generated_ids)
    start = len(traj.prompt_ids) + n1
    assert traj.token_ids[start:start + len(observation)] == observation
    assert traj.loss_mask[start:start + len(observation)] == [0] * len(observation)


async def test_the_environment_keeps_a_turn_without_calls_going_until_max_turns(tokenizer):
    class Nag(Guess):
        async def step(self, trajectory):
            return [{"role": "user", "content": "again"}], False

    async with ToolEnv.empty() as env:
        env.environment = load_environment(Nag)
        agent, _ = agent_for(tokenizer, env, ["I guess 1", "I guess 2", "I guess 3", "I guess 4"])
        traj = await agent.rollout({"messages": PLAY}, 0, GREEDY)
    assert traj.stop_reason == "max_turns" and len(traj.turns) == 3  # env.max_turns still bounds it
    assert traj.messages[-1]["role"] == "assistant"  # what it said after the last turn is not appended


async def test_the_reward_sees_its_own_episode_and_the_environments_state(tokenizer):
    class Keeper(Guess):
        async def reset(self, sample):
            self.state = {"secret": sample["secret"]}
            return []

        async def step(self, trajectory):
            return [], bool(trajectory.turns[-1].tool_calls) is False

    put = '<tool_call>\n{{"name": "put", "arguments": {{"key": "k", "value": "{}"}}}}\n</tool_call>'

    def script(prompt_ids, turn):
        text = tokenizer.decode(prompt_ids)
        secret = "apple" if "apple" in text else "pear"
        return put.format(secret) if turn == 0 else "done"

    async def reward(state, tools, **_):
        kept = await tools.call("get", {"key": "k"})  # this trajectory's own server, still open
        return float(kept.text == state["secret"])

    manifest = {"mcpServers": {"notes": {"command": "python", "args": [NOTES], "scope": "episode"}}}
    async with ToolEnv.from_manifest(manifest) as env:
        await env.list_tools()
        env.environment = load_environment(Keeper)
        agent, _ = agent_for(tokenizer, env, script)
        rows = [{"messages": [{"role": "user", "content": f"Remember {s}."}], "secret": s} for s in ("apple", "pear")]
        scorer = Scorer.wrap(RewardFn(reward))
        groups = await agent.rollout_groups(rows, [0, 1], 2, GREEDY, scorer=scorer)
        metrics = await scorer.wait([t for g in groups for t in g.trajectories])
        assert not env._episodes  # every episode closed once scored
    assert [t.reward for g in groups for t in g.trajectories] == [1.0] * 4
    assert metrics["reward/tool_calls"] == 4.0
    assert all(t.state["secret"] in t.tool_results[0].call.arguments["value"] for g in groups for t in g.trajectories)


class Flaky(Guess):
    """Fails in reset for samples marked bad, and for the first instance made of a `fail_first` run."""

    made = 0

    async def reset(self, sample):
        Flaky.made += 1
        if sample.get("bad") or (sample.get("fail_first") and Flaky.made == 1):
            raise RuntimeError("the board is broken")
        return await super().reset(sample)


async def test_a_failing_episode_drops_its_trajectory_and_the_group_is_its_survivors(tokenizer, caplog):
    Flaky.made = 0
    async with ToolEnv.empty() as env:
        env.environment = load_environment(Flaky)
        # Each trajectory guesses 75 at once (reward 1) or 10 then 75 (reward 0.5): a group with signal.
        agent, _ = agent_for(tokenizer, env, lambda p, turn: "I guess 75" if len(p) % 2 else
                             ["I guess 10", "I guess 75"][turn])
        rows = [{"messages": PLAY, "id": "ok", "fail_first": True}, {"messages": PLAY, "id": "broken", "bad": True}]

        def reward(state, **_):
            return 1.0 / len(state["guesses"])

        pipeline = RolloutPipeline(PipelineConfig(), agent=agent, rows=rows, sampler=PromptSampler(rows, 2, shuffle=False),
                                   batch_size=2, group_size=3, params=SamplingParams(1.0, 1.0, 64),
                                   scorer=Scorer.wrap(RewardFn(reward)))
        with caplog.at_level(logging.WARNING, logger="rl_factory"):
            batch = await pipeline.collect(step=1)
    failed = [t for t in batch.trajectories if t.dropped_by == EPISODE_FAILED]
    assert len(failed) == 4 and all(t.stop_reason == EPISODE_FAILED and t.reward is None for t in failed)
    assert batch.metrics["episode/dropped"] == 4.0
    assert summarize(batch.trajectories)["stop/episode_error"] == pytest.approx(4 / 6)
    # one line per sample, naming it and what failed
    lines = [r.getMessage() for r in caplog.records if "dropped from its group" in r.getMessage()]
    assert len(lines) == 2 and all("environment reset() raised RuntimeError: the board is broken" in x for x in lines)
    assert any(x.startswith("sample 1 (id 'broken')") for x in lines)
    (group,) = batch.groups  # the broken sample's group is gone; the other keeps its two survivors
    assert group.sample_index == 0 and len(group.trajectories) == 2
    rewards = [t.reward for t in group.trajectories]
    adv = assign_advantages("grpo", batch.groups, rewards=rewards).tolist()
    assert len(adv) == 2 and (rewards[0] == rewards[1] or adv[0] == pytest.approx(-adv[1]))


async def test_a_round_where_every_episode_fails_stops_with_the_first_cause(tokenizer):
    async with ToolEnv.empty() as env:
        env.environment = load_environment(Flaky)
        agent, _ = agent_for(tokenizer, env, ["I guess 75"])
        rows = [{"messages": PLAY, "bad": True}]
        pipeline = RolloutPipeline(PipelineConfig(), agent=agent, rows=rows, sampler=PromptSampler(rows, 1),
                                   batch_size=1, group_size=2, params=GREEDY, scorer=Scorer.wrap(RewardFn(lambda: 1.0)))
        with pytest.raises(EpisodeError, match="every episode of this round failed; the first: sample 0: "
                                               "environment reset"):
            await pipeline.collect(step=1)


def test_an_environment_class_missing_a_hook_is_refused_before_anything_starts(tmp_path):
    (tmp_path / "game.py").write_text(
        "class NoStep:\n    async def reset(self, sample): return []\n    async def close(self): pass\n"
        "class SyncReset:\n    def reset(self, sample): return []\n    async def step(self, t): return [], True\n"
        "    async def close(self): pass\n")
    cases = {"NoStep": "env.environment=" + str(tmp_path / "game.py") + ":NoStep: step is missing",
             "SyncReset": "reset is not `async def`",
             "Nope": "no class 'Nope' in " + str(tmp_path / "game.py") + " (classes there: NoStep, SyncReset)"}
    for name, message in cases.items():
        with pytest.raises(ConfigError) as err:
            open_env(EnvConfig(tools=None, environment=f"{tmp_path / 'game.py'}:{name}"))
        assert message in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(ConfigError, match="env.environment_kwargs do not fit"):
        open_env(EnvConfig(tools=None, environment="tests.test_environment:Guess", environment_kwargs={"nope": 1}))


async def test_step_may_not_speak_as_the_assistant(tokenizer):
    class Ventriloquist(Guess):
        async def step(self, trajectory):
            return [{"role": "assistant", "content": "I win"}], False

    async with ToolEnv.empty() as env:
        env.environment = load_environment(Ventriloquist)
        agent, _ = agent_for(tokenizer, env, ["I guess 1"])
        traj = await agent.run_episode({"messages": PLAY}, 3, GREEDY)
    assert traj.dropped_by == EPISODE_FAILED
    assert "has role 'assistant'; an environment answers as user or tool" in json.dumps(traj.reward_info)


async def test_episodes_close_when_their_rollouts_are_cancelled(tokenizer):
    manifest = {"mcpServers": {"notes": {"command": "python", "args": [NOTES], "scope": "episode"}}}
    async with ToolEnv.from_manifest(manifest) as env:
        await env.list_tools()
        agent, engine = agent_for(tokenizer, env, ["I guess 1"])
        engine.delay_s = 30.0  # generation never finishes: the episode is open when we cancel
        task = asyncio.ensure_future(agent.run_episode({"messages": PLAY}, 0, GREEDY))
        while not env._episodes:
            await asyncio.sleep(0.05)
        (episode,) = env._episodes
        conn = episode._instances[0][1]
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        assert not env._episodes and conn._owner is None  # closed by the rollout's own cleanup
