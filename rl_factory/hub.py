"""Hub model ids without a network: fail in a second with what to do, not after a minute of retries.

`model.path=Qwen/Qwen3-0.6B` on a machine without network used to retry for ~50 s and then raise an
error with no hint. `check_hub_model(path)` runs before anything is loaded: a local directory or
`builtin:` passes; a hub id already in the local Hugging Face cache makes the loaders work offline
(`HF_HUB_OFFLINE=1` for this process); a hub id not in the cache is looked up once with a short
timeout, and an unreachable hub is one line naming the choices.
"""
from __future__ import annotations

import os
from pathlib import Path

from rl_factory.base.errors import ConfigError

HUB_TIMEOUT_S = 3.0


class HubUnreachable(ConfigError):
    """A hub model id that is not cached locally while the hub cannot be reached."""


def is_hub_id(path: str) -> bool:
    if path.startswith(("builtin:", "/", ".", "~")) or Path(path).expanduser().exists():
        return False
    return path.count("/") <= 1  # "org/name" or "name"


def offline_requested() -> bool:
    return any(os.environ.get(k, "").lower() in ("1", "true", "yes") for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def is_cached(repo_id: str) -> bool:
    """The repo's config (or tokenizer config) is in the local Hugging Face cache."""
    from huggingface_hub import try_to_load_from_cache

    for name in ("config.json", "tokenizer_config.json"):
        try:
            found = try_to_load_from_cache(repo_id, name)
        except Exception:  # an id the hub library rejects (bad characters): let the loader say so
            return False
        if isinstance(found, str):
            return True
    return False


def hub_reachable(timeout_s: float = HUB_TIMEOUT_S) -> bool:
    import httpx2

    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    try:
        httpx2.head(endpoint, timeout=timeout_s, follow_redirects=False)
    except httpx2.HTTPError:
        return False
    return True


def check_hub_model(path: str, key: str = "model.path") -> None:
    """Make a hub id loadable offline if it is cached; raise HubUnreachable if it cannot be had.

    Raises:
        HubUnreachable: not cached and the hub is unreachable (or offline mode is on).
    """
    if not is_hub_id(path):
        return
    if is_cached(path):
        # Loading from the cache needs no network; without this, transformers still asks the hub
        # for newer files and retries for a minute when it is unreachable.
        if not hub_reachable():
            os.environ["HF_HUB_OFFLINE"] = "1"
        return
    where = "offline mode is on (HF_HUB_OFFLINE)" if offline_requested() else None
    if where is None and not hub_reachable():
        where = f"the Hugging Face hub ({os.environ.get('HF_ENDPOINT', 'https://huggingface.co')}) is unreachable"
    if where:
        raise HubUnreachable(
            f"{key}={path} is not in the local Hugging Face cache and {where}; use a local directory "
            f"({key}=/path/to/model), or download it where there is network (`huggingface-cli download {path}`) "
            "and run with HF_HUB_OFFLINE=1")
