"""Augmenters: one executed trajectory becomes several training samples ("views") of it.

`rollout.augment` lists them by registry name or as `file.py:fn` (entries shaped like the filters'):

    rollout.augment: [per_turn]
    rollout.augment: [{function: tool_prefix, kwargs: {decay: 0.5}}]

A view is cut from the trajectory's own token stream (`rollout.context=append`): the first `end` ids as
they are, with the loss mask kept only from `start` on (earlier tokens are context, mask 0), and a
`weight` that scales the trajectory's advantage for that sample. So every view is token-faithful by
construction: its ids are a prefix of the ids the engine produced and the tool observations appended,
its log-probs the ones recorded at generation, and nothing is re-rendered. Several augmenters add up
their views; no augmenter trains the trajectory as one sample (today's behaviour).

Built-ins (`AUGMENTERS`; `augment/<name>/samples` counts the views each made this step):
- `per_turn`: each assistant turn is a sample whose prompt is the exact prefix before it: Agent-R1's
  step-level samples (`rollout.context=step`) as a view of an `append` rollout, with no re-rendering.
- `tool_prefix`: the whole trajectory, plus for every tool result a sample whose context ends at that
  result and whose target is the rest of the trajectory (what the agent did with what the tool said).
  The view after the k-th result weighs `decay ** k`; with `normalize` (default) a trajectory's weights
  sum to 1, so a trajectory with many tool calls does not outweigh one with few. Tokens after the k-th
  result are trained in k + 1 views: later turns, which condition on more tool output, weigh more.

A user augmenter gets the keyword arguments it names: `trajectory`, `spans` (one `TurnSpan` per turn:
`gen_start`, `gen_end`, `obs_end` positions in `trajectory.token_ids`) and a reward's arguments, and
returns a list of `View(start, end, weight)` or `(start, end[, weight])` tuples. Views are checked: in
range, at least one generated token in `[start, end)`, a finite weight >= 0.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from rl_factory.config import ConfigError
from rl_factory.pipeline.entries import (PipelineError, call_user, check_options, check_unique, describe, is_spec,
                                         load_user, parse_entry)
from rl_factory.base.registry import Registry
from rl_factory.base.types import Step, Trajectory
from rewards.loader import RewardFn, reward_kwargs

ENTRY_KEYS = ("function", "name", "kwargs")


@dataclass(frozen=True)
class View:
    """A training sample of a trajectory: `token_ids[:end]`, loss on `[start, end)` only, advantage x weight."""

    start: int
    end: int
    weight: float = 1.0


@dataclass(frozen=True)
class TurnSpan:
    """Where turn k sits in `token_ids`: generated ids `[gen_start, gen_end)`, observation `[gen_end, obs_end)`."""

    gen_start: int
    gen_end: int
    obs_end: int


AugmentFn = Callable[..., list[View]]
AUGMENTERS: Registry[AugmentFn] = Registry("augmenter")
register_augmenter = AUGMENTERS.register


def turn_spans(traj: Trajectory) -> list[TurnSpan]:
    """The positions of each turn's generated and observation ids in an `append` trajectory.

    Raises:
        ValueError: the trajectory is not one `append` token stream (e.g. `rollout.context=step`).
    """
    spans, pos = [], len(traj.prompt_ids)
    for turn in traj.turns:
        gen_end = pos + len(turn.generated_ids)
        spans.append(TurnSpan(pos, gen_end, gen_end + len(turn.observation_ids)))
        pos = spans[-1].obs_end
    if pos != len(traj.token_ids):
        raise ValueError(f"sample {traj.sample_index}: augmenters need rollout.context=append trajectories "
                         "(one token stream of prompt, turns and observations)")
    return spans


@register_augmenter("per_turn")
def per_turn(traj: Trajectory, spans: list[TurnSpan]) -> list[View]:
    return [View(s.gen_start, s.gen_end) for s in spans if s.gen_end > s.gen_start]


@register_augmenter("tool_prefix")
def tool_prefix(traj: Trajectory, spans: list[TurnSpan], decay: float = 1.0, normalize: bool = True,
                include_full: bool = True) -> list[View]:
    end = len(traj.token_ids)
    # context ends at each tool result that some generated tokens follow
    cuts = [s.obs_end for s in spans if s.obs_end > s.gen_end and s.obs_end < end]
    starts = ([len(traj.prompt_ids)] if include_full else []) + cuts
    depth0 = 0 if include_full else 1
    weights = [decay ** (depth0 + k) for k in range(len(starts))]
    total = sum(weights) if normalize else 1.0
    return [View(start, end, w / total) for start, w in zip(starts, weights) if total > 0]


@dataclass
class Augmenter:
    """One entry of `rollout.augment`, ready to run."""

    name: str
    where: str
    builtin: AugmentFn | None = None
    user: RewardFn | None = None
    kwargs: dict[str, Any] = field(default_factory=dict)

    async def views(self, traj: Trajectory, spans: list[TurnSpan]) -> list[View]:
        if self.builtin is not None:
            return self.builtin(traj, spans, **self.kwargs)
        where = describe(self.where, self.user, traj)
        available = {**reward_kwargs(traj), "trajectory": traj, "spans": spans, "reward": traj.reward}
        result = await call_user(self.user, available, where)
        if not isinstance(result, (list, tuple)):
            raise PipelineError(f"{where} returned {type(result).__name__} {result!r:.60}; an augmenter returns "
                                "a list of views")
        return [_check_view(traj, item, where) for item in result]


def _check_view(traj: Trajectory, item: Any, where: str) -> View:
    if isinstance(item, (tuple, list)) and len(item) in (2, 3):
        item = View(*item)
    if not isinstance(item, View) or not all(isinstance(v, int) and not isinstance(v, bool)
                                             for v in (item.start, item.end)):
        raise PipelineError(f"{where} returned {item!r:.60}; an augmenter returns View(start, end, weight) "
                            "or (start, end[, weight]) with integer positions")
    if not 0 <= item.start < item.end <= len(traj.token_ids) or 1 not in traj.loss_mask[item.start:item.end]:
        raise PipelineError(f"{where}: view {item.start}:{item.end} is out of range or holds no generated token "
                            f"(the trajectory has {len(traj.token_ids)} tokens)")
    weight = item.weight
    if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight) or weight < 0:
        raise PipelineError(f"{where}: view weight {weight!r} must be a finite number >= 0")
    return item


def build_augmenters(entries: Sequence[Any] | None, where: str = "rollout.augment") -> list[Augmenter]:
    """The configured augmenters, checked (unknown names list the valid ones).

    Raises:
        ConfigError: a malformed entry, an unknown name, a spec that does not load, bad kwargs.
    """
    out = []
    for i, raw in enumerate(entries or []):
        here = f"{where}[{i}]"
        entry = parse_entry(raw, here, ENTRY_KEYS, "an augmenter")
        spec, name, kwargs = entry["function"], entry["name"], entry["kwargs"]
        if is_spec(spec):
            out.append(Augmenter(name, here, user=load_user(spec, kwargs, here, "augmenter")))
            continue
        try:
            fn = AUGMENTERS.lookup(spec)
        except KeyError as exc:
            raise ConfigError(f"{here}: {exc.args[0]} (or a user augmenter as 'file.py:fn')") from None
        check_options(fn, kwargs, here, skip=2)
        out.append(Augmenter(name, here, builtin=fn, kwargs=kwargs))
    check_unique([a.name for a in out], where, "augmenter")
    return out


async def augment(augmenters: list[Augmenter], trajs: list[Trajectory]) -> dict[str, float]:
    """Replace each trajectory's training samples by the augmenters' views; returns augment/* metrics.

    Every view becomes a `Step` (`traj.steps`), which the update trains with the trajectory's
    advantage times the view's weight.
    """
    if not augmenters:
        return {}
    counts = dict.fromkeys((a.name for a in augmenters), 0)
    for traj in trajs:
        spans = turn_spans(traj)
        steps = []
        for a in augmenters:
            views = await a.views(traj, spans)
            counts[a.name] += len(views)
            steps += [to_step(traj, v) for v in views]
        traj.steps = steps
    metrics = {f"augment/{name}/samples": float(c) for name, c in counts.items()}
    metrics["augment/samples_per_trajectory"] = sum(counts.values()) / len(trajs) if trajs else 0.0
    return metrics


def to_step(traj: Trajectory, view: View) -> Step:
    """The view's training sample: a prefix of the trajectory's own ids, log-probs and mask."""
    mask = [0] * view.start + traj.loss_mask[view.start:view.end]
    logprobs = [lp if m else 0.0 for lp, m in zip(traj.logprobs[:view.end], mask)]
    return Step(list(traj.token_ids[:view.end]), mask, logprobs, weight=view.weight)
