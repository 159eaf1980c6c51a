"""The memory example's reward: is the fact in the trajectory's own knowledge graph?

`tools` calls the trajectory's own episode, whose memory server (its own process and graph file) is still
running when the reward runs: `open_nodes` finds the person's entity. 1.0 when the entity exists and one
of its observations mentions the fact, 0.5 for the entity alone, else 0.0. Another trajectory's memories
are in another file, so they can neither help nor hurt.
"""
from __future__ import annotations

import json


async def reward(tools, person: str, fact: str, **_) -> dict:
    result = await tools.call("open_nodes", {"names": [person]})
    try:
        entities = json.loads(result.text).get("entities", []) if result.ok else []
    except (ValueError, AttributeError):
        entities = []
    entity = next((e for e in entities if e.get("name", "").lower() == person.lower()), None)
    remembered = entity is not None and any(fact.lower() in o.lower() for o in entity.get("observations", []))
    return {"score": 1.0 if remembered else 0.5 if entity is not None else 0.0, "entity": float(entity is not None)}
