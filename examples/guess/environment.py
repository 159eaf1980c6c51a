"""The number-guessing game as an environment: one instance per trajectory, answering every guess.

    env.environment=examples/guess/environment.py:GuessEnv   env.tools=null   env.max_turns=4

The dataset row names the secret (`answer`) and the range (`low`, `high`); its prompt asks for a
guess. After each assistant turn `step` reads the turn as one number: a hit ends the episode, a miss
is answered "higher" or "lower" (a user message, masked out of the loss like a tool result), and a
turn that is not one number in range is told so and costs a turn. What happened is kept in `state`,
which the reward (examples/guess/reward.py) reads.
"""
from __future__ import annotations

from typing import Any

from rl_factory.models.guess import feedback, invalid_text, parse_guess


class GuessEnv:
    """Plays one game against the trajectory it was made for."""

    def __init__(self):
        self.state: dict[str, Any] = {}

    async def reset(self, sample: dict) -> list[dict]:
        low, high = int(sample.get("low", 1)), int(sample.get("high", 8))
        self.state = {"secret": int(sample["answer"]), "low": low, "high": high, "guesses": [], "solved": False}
        return []  # the dataset's prompt already opens the game

    async def step(self, trajectory) -> tuple[list[dict], bool]:
        s = self.state
        guess = parse_guess(trajectory.turns[-1].text, s["low"], s["high"])
        s["guesses"].append(guess)  # None for a turn that was not a number in range
        if guess == s["secret"]:
            s["solved"] = True
            return [], True
        reply = invalid_text(s["low"], s["high"]) if guess is None else feedback(guess, s["secret"])
        return [{"role": "user", "content": reply}], False

    async def close(self) -> None:
        pass  # nothing outside this object to release
