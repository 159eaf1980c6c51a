"""Per-server knobs beyond the desktop `mcpServers` shape: the restart policy and the result cache.

    restart: never | on_crash | {max_restarts: 5, backoff_s: 1, max_backoff_s: 30}
    cache: true | {ttl_s: 300, max_entries: 1024, tools: [search]}

`cache` also applies to `functions` entries. Used by envs.mcp_client (restart) and envs.cache.
"""
from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator


class RestartPolicy(BaseModel):
    """What to do when a server dies: restart it on the next call, with backoff, or give up.

    The first restart after a crash is immediate; each further crash without a successful call
    in between waits `backoff_s`, then twice that, ... up to `max_backoff_s` (calls meanwhile fail
    fast). After `max_restarts` consecutive restarts with no successful call (None: no limit;
    0: `restart: never`) the server stays down and its calls return "crashed" errors.
    """

    model_config = ConfigDict(extra="forbid")
    max_restarts: int | None = Field(default=None, ge=0)
    backoff_s: float = Field(default=1.0, ge=0)
    max_backoff_s: float = Field(default=30.0, ge=0)

    @model_validator(mode="before")
    @classmethod
    def _from_word(cls, data: Any) -> Any:
        # `restart: never | on_crash` (or a YAML boolean) for the two policies people ask for.
        words = {"never": {"max_restarts": 0}, "on_crash": {}, False: {"max_restarts": 0}, True: {}}
        if isinstance(data, str | bool):
            if data not in words:
                raise ValueError(f"expected 'never', 'on_crash' or a mapping, got {data!r}")
            return words[data]
        return data


class CacheSpec(BaseModel):
    """A TTL cache of successful results, keyed by tool and canonical JSON arguments.

    Only for deterministic tools: a cached call is not sent to the server again. `tools` limits
    it to some tools (the server's own names); None caches every tool of the server.
    """

    model_config = ConfigDict(extra="forbid")
    ttl_s: float = Field(default=300.0, gt=0)
    max_entries: int = Field(default=1024, ge=1)
    tools: list[str] | None = None


def cache_shorthand(value: Any) -> Any:
    # `cache: true` = the defaults; `cache: false` = no cache.
    if value is True:
        return {}
    return None if value is False else value
