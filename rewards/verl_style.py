"""verl's reward signature, recognised: `compute_score(data_source, solution_str, ground_truth, extra_info=None, **kw)`.

verl, RL-Factory and Agent-R1 users bring reward functions written for verl's reward manager, which calls

    compute_score(data_source=..., solution_str=..., ground_truth=..., extra_info=..., **reward_kwargs)

Such a function runs here unchanged, on both backends (the embedded scorer and verl's reward workers both
load rewards through `rewards.loader`, which asks this module): `solution_str`, `ground_truth` and
`transcript` are standard reward arguments (`reward_kwargs`), and a function that names `solution_str` is
*verl-style*, which changes three things, all to match what verl passes:

- `solution_str` is the final assistant message (`completion`), or, when the function asks for it with
  the attribute `compute_score.solution_str = "transcript"`, the whole transcript after the prompt (see
  `transcript`), which is what verl's manager decodes for a multi-turn rollout;
- `extra_info` is the row's `extra_info` dict, `{}` when the row has none (verl's default), never None;
- a function taking `**kwargs` gets verl's four arguments and those it names (and the config's fixed
  `kwargs`), not every argument we have: verl passes nothing else, and such functions often forward
  their `**kwargs` somewhere that would choke on ours.

verl's return values are ours already: a float, or a dict with "score" whose other keys become
per-trajectory reward metrics (rewards.loader.normalize_reward).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rl_factory.base.types import Trajectory

VERL_ARGS = ("data_source", "solution_str", "ground_truth", "extra_info")
# What `solution_str` holds, chosen by the function's `solution_str` attribute (default: completion)
SOLUTION_STR = ("completion", "transcript")
SWITCH = "solution_str"  # the attribute a verl-style function sets to ask for the transcript


@dataclass(frozen=True)
class VerlStyle:
    """How a verl-style reward function is called: which text is its `solution_str`."""

    solution_str: str = "completion"

    def arguments(self, available: dict[str, Any]) -> dict[str, Any]:
        """`available` with verl's meanings: `solution_str` from the chosen text, `extra_info` a dict."""
        extra = available.get("extra_info")
        return {**available, "solution_str": available.get(self.solution_str, ""),
                "extra_info": dict(extra) if isinstance(extra, dict) else {}}


def recognise(fn: Callable[..., Any], arg_names: list[str]) -> VerlStyle | None:
    """A `VerlStyle` if `fn` names `solution_str` (verl's name for the response), else None.

    Raises:
        ValueError: the function's `solution_str` attribute is not one of `SOLUTION_STR`.
    """
    if "solution_str" not in arg_names:
        return None
    mode = getattr(fn, SWITCH, "completion")
    if mode not in SOLUTION_STR:
        raise ValueError(f"its attribute {SWITCH} = {mode!r} must be one of {list(SOLUTION_STR)}")
    return VerlStyle(mode)


def transcript(traj: Trajectory) -> str:
    """Everything after the prompt as one string: each assistant turn's text as generated (tool-call markup
    included), then each of its tool results inside `<tool_response>` tags, as Qwen's and Hermes' chat
    templates write them; newline-separated. verl decodes the response tokens instead, so its string also
    holds the template's role words (`user`, `assistant`) between turns; messages an environment
    (`env.environment`) speaks are not in it."""
    parts: list[str] = []
    for turn in traj.turns:
        parts.append(turn.text)
        parts.extend(f"<tool_response>\n{result.text}\n</tool_response>" for result in turn.tool_results)
    return "\n".join(parts)
