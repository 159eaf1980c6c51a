"""A rule-based pointwise reward for the travel example (the LLM judge is what ArenaRL trains on).

It scores what can be checked against the world: the plan names a real place of every requested kind
in the right city (coverage, 0.6), the agent looked those kinds up with `search_poi` (0.2), and it
asked `route` for the requested transport mode (0.2). It cannot see whether a plan is pleasant or well
explained; that is the pairwise judge's job (`judge_prompt.txt`). Use it to evaluate, to watch
`arena/reward_spearman` (how far the judge's ranking agrees with it), or as an offline judge
(`algorithm.arena.judge.type=reward`).
"""
from __future__ import annotations

from examples.travel.world import CITIES


def reward(completion: str, tool_calls: list, city: str, categories: list, mode: str, **_) -> dict:
    text = completion.lower()
    named = {p.category for p in CITIES.get(city, []) if p.name.lower() in text}
    coverage = sum(c in named for c in categories) / len(categories)
    searched_kinds = {str((c.get("arguments") or {}).get("category")) for c in tool_calls
                      if c["name"] == "search_poi" and (c.get("arguments") or {}).get("city") == city}
    searched = sum(c in searched_kinds for c in categories) / len(categories)
    routed = float(any(c["name"] == "route" and (c.get("arguments") or {}).get("mode", "walk") == mode
                       for c in tool_calls))
    return {"score": 0.6 * coverage + 0.2 * searched + 0.2 * routed, "coverage": coverage,
            "searched": searched, "routed": routed}
