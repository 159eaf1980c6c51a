"""The capability table as Markdown: the docs' backend-capabilities page, generated from `LIMITS`
(rl_factory/capabilities.py), the same rows every refusal is raised from."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rl_factory.capabilities import BACKENDS, INLINE_SAMPLE_REFS, INPUTS, LIMITS, _NO, Limit, Ref, _fill, _show


def _kinds() -> list[tuple[str, str, list[Any], bool]]:
    """(title, config key, names, list-valued) of every pluggable kind, the names from the registries."""
    from typing import get_args

    from rewards.judge import JUDGES
    from rewards.process import OUTCOME_MODES
    from rl_factory.algorithms.advantages import ADVANTAGES
    from rl_factory.algorithms.arena import TOPOLOGIES
    from rl_factory.group_arena import ANCHORS
    from rl_factory.algorithms.losses import AGGREGATIONS, POLICY_LOSSES
    from rl_factory.context import CONTEXT_POLICIES, CONTEXT_PROCESSORS
    from rl_factory.critic import CRITIC_TYPES
    from rl_factory.pipeline.augment import AUGMENTERS
    from rl_factory.pipeline.filters import FILTERS
    from rl_factory.algorithms.correction import CORRECTIONS
    from rl_factory.update import OldLogProbs

    return [
        ("Advantage estimator", "algorithm.advantage", sorted(ADVANTAGES), False),
        ("Critic (gae)", "algorithm.critic.type", list(CRITIC_TYPES), False),
        ("Policy loss", "algorithm.policy_loss", sorted(POLICY_LOSSES), False),
        ("Loss aggregation", "algorithm.loss_agg", list(AGGREGATIONS), False),
        ("Old log-probs", "algorithm.old_log_probs", list(get_args(OldLogProbs)), False),
        ("Context policy", "rollout.context", sorted(CONTEXT_POLICIES), False),
        ("Context processor (step)", "rollout.context_processor", sorted(CONTEXT_PROCESSORS), False),
        ("Rollout filter", "rollout.filters", sorted(FILTERS), True),
        ("Augmenter", "rollout.augment", sorted(AUGMENTERS), True),
        ("Dynamic sampling", "rollout.dynamic_sampling.min_groups", [None, "N"], False),
        ("Arena topology", "algorithm.arena.topology", sorted(TOPOLOGIES), False),
        ("Arena anchor", "algorithm.arena.anchor", list(ANCHORS), False),
        ("Arena judge", "algorithm.arena.judge.type", sorted(JUDGES), False),
        ("Process rewards in outcome estimators", "reward.process.outcome_mode", list(OUTCOME_MODES), False),
        ("Tool manifest", "env.tools", ["a file, or an inline manifest", INLINE_SAMPLE_REFS], False),
        ("Environment", "env.environment", [None, "file.py:Class"], False),
        ("LoRA", "model.lora_rank", [0, "R > 0"], False),
        ("Async training", "trainer.max_staleness", [0, "k > 0"], False),
        ("Partial rollouts (async)", "trainer.partial_rollouts", [True, False], False),
        ("Off-policy correction", "algorithm.correction.type", ["none", *sorted(CORRECTIONS)], False),
    ]


def _verdict(limit: Limit, key: str, name_facts: Mapping[str, Any]) -> bool | None:
    """Whether `limit` refuses the name in `name_facts` (True: always, None: under other settings, False: never)."""
    conds = (limit.feature, *limit.when)
    known = [c for c in conds if c.key in name_facts and not any(isinstance(v, Ref) for v in c.values)]
    if not any(c.key == key for c in conds) or any(c.matching(name_facts) is _NO for c in known):
        return False
    if name_facts[key] is None and any(c.key == key for c in conds):  # null: the feature is off
        return False
    return True if len(known) == len(conds) else None


def render_markdown() -> str:
    """The backend x feature table (docs/reference/capabilities.md), from `LIMITS` and the registries."""
    from rl_factory.algorithms.advantages import required_inputs

    numbers = {limit: i + 1 for i, limit in enumerate(LIMITS)}
    lines = ["A config the chosen backend cannot train stops before anything starts, with one line of the form",
             "`<key>=<value> is not supported on the <backend> backend [with <key>=<value>]: <why>; <instead>`",
             "(\"any backend\" where neither can). Every name the registries hold is listed; \"yes, see N\" means",
             "supported except in the combinations of limit N, \"no (N)\" refused by limit N.", "",
             "## Support by name", "",
             "| feature | key | value | embedded | verl |", "|---|---|---|---|---|"]
    for title, key, names, listed in _kinds():
        for name in names:
            name_facts: dict[str, Any] = {key: (name,) if listed else name}
            if key == "algorithm.advantage":
                name_facts[INPUTS] = tuple(required_inputs(name))
            cells = []
            for backend in BACKENDS:
                hits = [(numbers[lim], v) for lim in LIMITS if backend in lim.backends
                        and (v := _verdict(lim, key, name_facts)) is not False]
                never = [n for n, v in hits if v]
                cells.append(f"no ({', '.join(map(str, never))})" if never else
                             f"yes, see {', '.join(str(n) for n, _ in hits)}" if hits else "yes")
            lines.append(f"| {title} | `{key}` | `{_show(name)}` | {cells[0]} | {cells[1]} |")
    lines += ["", "## Limits", "",
              "| # | refused | on | when also | why | instead |", "|---|---|---|---|---|---|"]
    for limit in LIMITS:
        when = "; ".join(c.text() for c in limit.when) or "always"
        on = "both" if set(limit.backends) == set(BACKENDS) else ", ".join(limit.backends)
        lines.append(f"| {numbers[limit]} | {limit.feature.text()} | {on} | {when} | {_fill(limit.why, None)} "
                     f"| {_fill(limit.instead, None)} |")
    return "\n".join(lines) + "\n"
