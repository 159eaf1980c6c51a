"""Reading a tool manifest file: YAML (alias-safe), JSON, or RL-Factory's `.pydata`, into the plain mapping
that envs.manifest validates.

YAML aliases make a small file a huge document (nine aliases of nine aliases of ...: 529 bytes, minutes to
walk), so a document that expands past MAX_EXPANDED_VALUES values, refers to itself or nests past MAX_DEPTH
is refused before anything walks it. `.pydata` goes through envs.manifest_formats (a Python literal, never
executed).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from envs.manifest_error import ManifestError
from envs.manifest_formats import EntryCheck, from_entries, is_webui_spec, read_pydata

# libyaml's loader where PyYAML has it: the pure-Python one reads a 1 MiB manifest in 10 s.
YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
MAX_EXPANDED_VALUES = 200_000  # lists and mappings and their entries, after YAML aliases are expanded
MAX_DEPTH = 64


def read_manifest_file(path: Path, check_entry: EntryCheck) -> Any:
    """The manifest file's contents as a mapping (`{}` for an empty file), not yet validated as a whole; each entry of
    RL-Factory's list is validated on its own by `check_entry` (envs.manifest's model), so an error names it."""
    if not path.is_file():
        raise ManifestError(f"tool manifest not found: {path} (looked at {path.resolve()})")
    text = path.read_text(encoding="utf-8")
    try:
        # JSON is parsed as JSON so its errors read as JSON errors; RL-Factory's .pydata as a Python
        # literal (envs.manifest_formats, never executed); everything else as YAML.
        data = (read_pydata(path, text) if path.suffix == ".pydata" else
                json.loads(text) if path.suffix == ".json" else yaml.load(text, Loader=YAML_LOADER))
    except (json.JSONDecodeError, yaml.YAMLError) as err:
        raise ManifestError(f"{path}: not valid {'JSON' if path.suffix == '.json' else 'YAML'}: "
                            f"{' '.join(str(err).split())}") from None
    except RecursionError:
        raise ManifestError(f"{path}: nested too deeply to read") from None
    check_aliases(data, path)
    if data is None:
        return {}
    if isinstance(data, list) or path.suffix == ".pydata":  # RL-Factory's list of entries (or one of them)
        return from_entries(data if isinstance(data, list) else [data], str(path), check_entry)
    if is_webui_spec(data):
        raise ManifestError(f"{path}: this is RL-Factory's WebUI tool spec (prompts and tools as inline pythonCode), "
                            "not a manifest; serve the tools from an MCP server or list them under functions "
                            "(docs/guides/coming-from.md)")
    if not isinstance(data, dict):
        raise ManifestError(f"{path}: expected a mapping with 'mcpServers', got {type(data).__name__}")
    return data


def check_aliases(data: Any, path: Path) -> None:
    """Refuse a document that YAML aliases expand past MAX_EXPANDED_VALUES values, one that refers to itself,
    or one nested past MAX_DEPTH: each alias is a reference to a shared object, which every later pass
    (interpolation, validation) walks again, so nine aliases of nine aliases of ... (a 529-byte file) took
    minutes. Linear: each distinct list or mapping is visited once."""
    size: dict[int, int] = {}
    depth: dict[int, int] = {}
    open_: set[int] = set()
    stack: list[tuple[Any, bool]] = [(data, False)]
    while stack:
        node, done = stack.pop()
        if not isinstance(node, dict | list) or id(node) in size:
            continue
        kids = [v for v in (node.values() if isinstance(node, dict) else node) if isinstance(v, dict | list)]
        if not done:
            if id(node) in open_:
                raise ManifestError(f"{path}: a YAML alias refers to a value that contains it")
            open_.add(id(node))
            stack.append((node, True))
            stack.extend((kid, False) for kid in kids)
            continue
        if any(id(kid) in open_ for kid in kids):
            raise ManifestError(f"{path}: a YAML alias refers to a value that contains it")
        open_.discard(id(node))
        size[id(node)] = 1 + len(node) + sum(size[id(kid)] for kid in kids)
        depth[id(node)] = 1 + max((depth[id(kid)] for kid in kids), default=0)
        if size[id(node)] > MAX_EXPANDED_VALUES:
            raise ManifestError(f"{path}: more than {MAX_EXPANDED_VALUES} values once its YAML aliases (*name) are "
                                "expanded; a manifest needs a few hundred (use fewer aliases)")
        if depth[id(node)] > MAX_DEPTH:
            raise ManifestError(f"{path}: nested more than {MAX_DEPTH} levels deep")
