"""The guessing game's reward: 1 for a first-guess hit, 1/max_turns less for every extra turn, 0 unsolved.

With `env.max_turns=4` (pass the reward `max_turns` too if you change it): solved in 1, 2, 3, 4 turns
scores 1, 3/4, 1/2, 1/4. Every solved game scores at least 1/max_turns, so `reward.success_threshold=0.1`
makes `accuracy` the success rate. It reads what the environment kept (`state`, from
examples/guess/environment.py), not the text.
"""


def reward(state: dict, max_turns: int = 4) -> float:
    if not state.get("solved"):
        return 0.0
    return max(0.0, 1.0 - (len(state["guesses"]) - 1) / max_turns)
