"""The guessing game (examples/guess): its environment, reward, data, the warm start of builtin:tiny-guess,
two training steps on the embedded default with a quickly built tiny-guess model, and main_eval.sh's summary."""
from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest

from examples.guess.environment import GuessEnv
from examples.guess.prepare_data import main as prepare
from examples.guess.reward import reward
from rl_factory.models.guess import (HIGHER, LOWER, GuessModelConfig, build_guess_model, build_key,
                                     ensure_guess_model, games, invalid_text, prompt_text)
from rl_factory.types import Trajectory, Turn
from tests.records import jsonl

pytestmark = [pytest.mark.anyio, pytest.mark.slow]  # builds the guess model (a module fixture) and trains on it
ROOT = Path(__file__).resolve().parents[2]
GUESS = ROOT / "examples" / "guess"
# A few seconds' build: enough games and steps for the format (a number, then end of turn), no skill.
QUICK = GuessModelConfig(num_games=300, rules_steps=40, weak_steps=5)
# The README's command, minus its budgets and model.
EXAMPLE = ["env.tools=null", f"env.environment={GUESS / 'environment.py'}:GuessEnv", "env.max_turns=4",
           f"data.train_files={GUESS / 'data' / 'train.jsonl'}", f"data.val_files={GUESS / 'data' / 'val.jsonl'}",
           f"reward.function={GUESS / 'reward.py'}:reward", "reward.success_threshold=0.1",
           "rollout.max_response_tokens=8", "optim.lr=5e-4", "algorithm.loss_agg=seq_mean_token_mean"]


@pytest.fixture(scope="module")
def guess_model_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tiny_guess")
    build_guess_model(out, QUICK, log=lambda *_: None)
    return out


def sample(secret: int) -> dict:
    return {"prompt": prompt_text(1, 8), "answer": secret, "low": 1, "high": 8}


def so_far(texts: list[str], row: dict) -> Trajectory:
    return Trajectory(sample_index=0, prompt_ids=[], token_ids=[], loss_mask=[], logprobs=[], messages=[],
                      turns=[Turn([], [], t) for t in texts], stop_reason="running", sample=row)


async def play(env: GuessEnv, row: dict, texts: list[str]) -> list[tuple[list[dict], bool]]:
    assert await env.reset(row) == []
    return [await env.step(so_far(texts[: i + 1], row)) for i in range(len(texts))]


async def test_the_environment_answers_each_guess_until_it_is_right():
    env, row = GuessEnv(), sample(6)
    replies = await play(env, row, ["4", " 7\n", "x", "9", "", "6"])
    said = [(m[0]["content"] if m else None, done) for m, done in replies]
    assert said == [(HIGHER, False), (LOWER, False), (invalid_text(1, 8), False), (invalid_text(1, 8), False),
                    (invalid_text(1, 8), False), (None, True)]
    assert all(m["role"] == "user" for m, _ in replies for m in m)
    assert env.state == {"secret": 6, "low": 1, "high": 8, "guesses": [4, 7, None, None, None, 6], "solved": True}
    assert reward(state=env.state) == 0.0 and reward(state=env.state, max_turns=6) == pytest.approx(1 / 6)


async def test_each_episode_keeps_its_own_state():
    a, b = GuessEnv(), GuessEnv()
    await play(a, sample(2), ["5"])
    await play(b, sample(8), ["5", "8"])
    assert a.state["guesses"] == [5] and not a.state["solved"]
    assert b.state["guesses"] == [5, 8] and b.state["solved"]


@pytest.mark.parametrize("guesses, solved, value", [
    ([3], True, 1.0), ([1, 3], True, 0.75), ([4, 6, 7], True, 0.5), ([4, 6, 8, 7], True, 0.25),
    ([4, 6, 8, 5], False, 0.0), ([], False, 0.0)])
def test_the_reward_falls_with_the_turns_used(guesses, solved, value):
    assert reward(state={"guesses": guesses, "solved": solved}) == pytest.approx(value)
    assert reward(state={"guesses": guesses, "solved": solved}, max_turns=8) >= value


def test_the_data_script_writes_the_shipped_files(tmp_path):
    prepare(["--out-dir", str(tmp_path)])
    for name in ("train.jsonl", "val.jsonl"):
        assert (tmp_path / name).read_text() == (GUESS / "data" / name).read_text()
    val = [json.loads(line) for line in (tmp_path / "val.jsonl").read_text().splitlines()]
    train = [json.loads(line) for line in (tmp_path / "train.jsonl").read_text().splitlines()]
    assert [r["answer"] for r in val] == list(range(1, 9))  # every secret once: greedy validation is exact
    assert {r["answer"] for r in train} == set(range(1, 9)) and len(train) == 1024
    assert {r["prompt"] for r in train + val} == {prompt_text(1, 8)}  # the model cannot see the secret


def test_warm_start_games_follow_the_rules_and_only_phase_one_follows_the_feedback():
    cfg = GuessModelConfig(num_games=400)

    def possible_share(played: list[list[dict]]) -> float:
        kept = total = 0
        for game in played:
            assert game[0] == {"role": "user", "content": prompt_text(1, 8)}
            lo, hi = 1, 8
            turns = game[1:]
            assert [m["role"] for m in turns] == ["assistant", "user"] * (len(turns) // 2) + ["assistant"]
            assert len(turns) // 2 + 1 <= cfg.max_turns
            for guess, answer in zip(turns[::2], turns[1::2] + [None]):
                g = int(guess["content"])
                kept, total = kept + (lo <= g <= hi), total + 1
                if answer is not None:
                    assert answer["content"] in (HIGHER, LOWER)
                    lo, hi = (max(lo, g + 1), hi) if answer["content"] == HIGHER else (lo, min(hi, g - 1))
        return kept / total

    assert possible_share(games(cfg, 1.0)) == 1.0
    assert 0.5 < possible_share(games(cfg, 0.3)) < 0.8


def test_the_builtin_is_cached_and_refuses_tools(tmp_path, monkeypatch):
    from rl_factory.policy import BUILTIN_MODELS, BUILTIN_TOKENIZERS, resolve_model_path

    monkeypatch.setenv("RL_FACTORY_CACHE", str(tmp_path))
    tiny = GuessModelConfig(num_games=50, rules_steps=2, weak_steps=1)
    lines: list[str] = []
    first = ensure_guess_model(tiny, log=lines.append)
    assert ensure_guess_model(tiny, log=lines.append) == first and first.parent == tmp_path / "models"
    assert sum("building" in line for line in lines) == 1  # the second call found it in the cache
    assert build_key(replace(tiny, seed=1)) != build_key(tiny) and build_key(tiny) in first.name
    with pytest.raises(ValueError, match="env.tools=null"):
        resolve_model_path("builtin:tiny-guess", [{"type": "function", "function": {"name": "calculator"}}], 0)
    assert "tiny-guess" in BUILTIN_MODELS and "tiny-guess" in BUILTIN_TOKENIZERS


def test_the_doctor_gets_the_tokenizer_the_build_makes(guess_model_dir, tmp_path, monkeypatch):
    from transformers import AutoTokenizer

    from rl_factory.models.guess import guess_tokenizer

    monkeypatch.setenv("RL_FACTORY_CACHE", str(tmp_path))  # nothing built: made from the games alone
    tokenizer = guess_tokenizer(QUICK)
    assert tokenizer.get_vocab() == AutoTokenizer.from_pretrained(guess_model_dir).get_vocab()
    assert [tokenizer.decode([i]) for i in tokenizer.encode("12")] == ["1", "2"]  # digits are single tokens


async def test_the_warm_start_lays_games_out_as_the_rollout_does(guess_model_dir):
    """A game replayed through the real rollout (scripted guesses, GuessEnv answering) gives the ids and
    loss mask the warm start trained on: the feedback turns are observations (mask 0)."""
    from transformers import AutoTokenizer

    from envs import ToolEnv, get_parser
    from envs.environment import load_environment
    from rl_factory.chat import ChatFormat
    from rl_factory.data import load_dataset
    from rl_factory.engines.base import SamplingParams
    from rl_factory.engines.scripted import ScriptedEngine
    from rl_factory.models.warmstart import tokenize_transcript
    from rl_factory.rollout import Agent, RolloutConfig

    tokenizer = AutoTokenizer.from_pretrained(guess_model_dir)
    fmt = ChatFormat(tokenizer)
    game = next(g for g in games(GuessModelConfig(num_games=50), 1.0) if len(g) == 6)  # two misses, then a hit
    row = load_dataset(GUESS / "data" / "val.jsonl")[int(game[-1]["content"]) - 1]
    env = ToolEnv.empty()
    env.environment = load_environment(f"{GUESS / 'environment.py'}:GuessEnv")
    async with env:
        await env.list_tools()
        agent = Agent(ScriptedEngine(tokenizer, [m["content"] for m in game[1::2]]), env, fmt, get_parser("hermes"),
                      RolloutConfig(max_turns=4, max_response_tokens=8))
        traj = await agent.rollout(row, 0, SamplingParams(1.0, 1.0, 8))
    assert traj.stop_reason == "env_done" and traj.state["solved"] and len(traj.turns) == 3
    assert traj.messages[1:] == game[1:]  # the environment said what the warm-start games say
    ids, mask = tokenize_transcript(fmt, game)
    assert (traj.token_ids, traj.loss_mask) == (ids, mask)
    said = tokenizer.decode([t for t, m in zip(ids, mask) if m == 0])
    assert said.count(HIGHER) + said.count(LOWER) == 2


def test_two_training_steps_on_the_embedded_default(guess_model_dir, two_steps, tmp_path):
    lines = two_steps(*EXAMPLE, f"model.path={guess_model_dir}", "trainer.save_rollouts=true")
    assert [m["step"] for m in lines] == [0, 1, 2]
    for m in lines[1:]:
        assert m["episode/opened"] == 4 and m.get("episode/failed", 0) == 0
    rollouts = tmp_path / "run" / "rollouts" / "step_000002.jsonl"
    records = jsonl(rollouts)
    assert len(records) == 4
    for r in records:
        state, turns = r["state"], r["turn_texts"]
        assert state["secret"] == r["answer"] and len(state["guesses"]) == len(turns) <= 4
        assert r["stop_reason"] == ("env_done" if state["solved"] else "max_turns")
        assert r["reward"] == pytest.approx(reward(state=state))
        # between two assistant turns, exactly the environment's answer to the first of them
        for i, message in enumerate(r["messages"][2::2]):
            guess = state["guesses"][i]
            expected = invalid_text(1, 8) if guess is None else (HIGHER if state["secret"] > guess else LOWER)
            assert message == {"role": "user", "content": expected}
    # the quick model has learnt the format: most turns are numbers in range
    guesses = [g for r in records for g in r["state"]["guesses"]]
    assert sum(g is not None for g in guesses) >= len(guesses) / 2


def test_main_eval_says_how_the_games_stopped(guess_model_dir, tmp_path):
    """main_eval.sh's summary for an environment task: the shares of each stop reason instead of tool-call
    rates, and the games not won named by how they stopped (the turns ran out), as the rollouts say."""
    import logging

    from rl_factory.config import load_config
    from rl_factory.evaluate_cli import run_eval

    args = [a for a in EXAMPLE if not a.startswith(("data.train_files", "optim.", "algorithm.", "env.max_turns"))]
    cfg = load_config("eval", [*args, f"model.path={guess_model_dir}", "model.device=cpu", "env.max_turns=2",
                               f"eval.output_dir={tmp_path}", "eval.n=4", "eval.temperature=1.0", "eval.progress=false"])
    lines: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())
    logger = logging.getLogger("rl_factory")  # its own handler: a run's setup_logging stops propagation
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        result = run_eval(cfg)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    printed = "\n".join(lines)
    records = jsonl(tmp_path / "rollouts.jsonl")
    stops = {r["stop_reason"] for r in records}
    assert stops <= {"env_done", "max_turns"} and "max_turns" in stops  # 2 turns: most games are not won
    for reason in stops:
        assert re.search(rf"stop/{reason}\s+{result['metrics'][f'stop/{reason}']:.3f}", printed), printed
    assert "tool/call_rate" not in printed and "tool/success_rate" not in printed
    unsolved = [r for r in records if not r["state"]["solved"]]
    assert all(r["stop_reason"] == "max_turns" and r["reward"] == 0.0 for r in unsolved)
    failures = result["failures"]
    assert list(failures) == ["not solved in max_turns"] and failures["not solved in max_turns"]["count"] == len(unsolved)
    assert "not solved in max_turns" in printed and "wrong answer" not in printed
