"""Per-episode values in a manifest: `${sample.<column>}` and `${episode.dir}` / `${episode.id}`.

    mcpServers:
      sql:
        command: python
        args: ["-m", "examples.sql.server", "--db", "${sample.db_path}", "--workdir", "${episode.dir}"]
        scope: episode
      lookup:
        url: http://127.0.0.1:8000/mcp
        hidden_arguments: {query: {db_id: "${sample.db_id}"}}

`${sample.col}` names a column of the trajectory's dataset row (`${sample.extra_info.db_id}` reaches
into a mapping column); `${episode.dir}` is a fresh directory that exists for the episode's life and
is removed when it closes (also on failure and Ctrl-C); `${episode.id}` a short unique id.

They differ from the `${VAR}` / `${oc.env:VAR}` environment interpolation of `envs.manifest`, which
runs once when the manifest is loaded and whose values are secrets to mask: these run once per
episode, their values are data (a path, an id), and they are never registered as secrets. The
launch line (`command`'s `args`, `env`, `cwd`, `url`, `headers`) may name them only on a
`scope: episode` server, which is started for one episode; `hidden_arguments` may name them on any
server, since they are filled into each call made through an episode.

A value that is exactly one reference keeps the column's type (`"${sample.n}"` gives the integer 3 to a
hidden argument); a reference inside a longer string is formatted into it. Launch-line values are
always text.
"""
from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

REF = re.compile(r"\$\{(sample|episode)\.([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*)\}")
EPISODE_VARS = ("dir", "id")
LAUNCH_FIELDS = ("args", "env", "cwd", "url", "headers")
MAX_LISTED_COLUMNS = 12


class TemplateError(ValueError):
    """A reference that cannot be filled for this sample (the message names the key and the column)."""


@dataclass(frozen=True)
class EpisodeVars:
    """What `${episode.*}` stands for in one episode."""

    id: str
    dir: str | None = None  # made only when some value names it


def refs(value: Any) -> Iterator[tuple[str, str]]:
    """Every (kind, name) referenced in a string, list or mapping, recursively."""
    if isinstance(value, str):
        for match in REF.finditer(value):
            yield match.group(1), match.group(2)
    elif isinstance(value, Mapping):
        for v in value.values():
            yield from refs(v)
    elif isinstance(value, list | tuple):
        for v in value:
            yield from refs(v)


def launch_refs(spec: Any) -> list[tuple[str, str]]:
    """The references in a server's launch line (the fields that start or reach the server)."""
    return [r for key in LAUNCH_FIELDS for r in refs(getattr(spec, key))]


def check_server(name: str, spec: Any) -> None:
    """The episode knobs of one manifest entry, checked when the manifest loads (ValueError: the key)."""
    for key in LAUNCH_FIELDS:
        found = list(refs(getattr(spec, key)))
        if found and spec.scope != "episode":
            kind, ref = found[0]
            raise ValueError(f"{key} names ${{{kind}.{ref}}}, which only a `scope: episode` server has (it is "
                             "started per episode); set scope: episode, or fill a tool argument per sample "
                             "with hidden_arguments")
    for kind, ref in [*launch_refs(spec), *refs(spec.hidden_arguments)]:
        if kind == "episode" and ref not in EPISODE_VARS:
            raise ValueError(f"unknown reference ${{episode.{ref}}} (valid: "
                             + ", ".join(f"${{episode.{v}}}" for v in EPISODE_VARS) + ")")
    if spec.pool and spec.scope != "episode":
        raise ValueError("pool keeps started processes for per-episode servers: it needs scope: episode")
    if spec.pool and launch_refs(spec):
        kind, ref = launch_refs(spec)[0]
        raise ValueError(f"pool starts processes before their episode exists, but the launch line names "
                         f"${{{kind}.{ref}}}; drop pool, or move the value into hidden_arguments")
    if spec.scope == "episode" and spec.cache is not None:
        raise ValueError("cache does not apply to a scope: episode server: its results depend on the "
                         "episode's own state")
    for tool, args in spec.hidden_arguments.items():
        if not isinstance(args, Mapping) or not args:
            raise ValueError(f"hidden_arguments.{tool}: expected a mapping of argument name to value")


def needs_dir(values: Any) -> bool:
    """Whether `values` (a ServerSpec's launch line, or a mapping such as hidden_arguments) names ${episode.dir}."""
    found = launch_refs(values) if hasattr(values, "model_copy") else refs(values)
    return ("episode", "dir") in set(found)


def fill(value: Any, sample: Mapping[str, Any], episode: EpisodeVars, where: str, as_text: bool = False) -> Any:
    """`value` with every reference replaced; raises TemplateError naming `where` and the column."""
    if isinstance(value, Mapping):
        return {k: fill(v, sample, episode, f"{where}.{k}", as_text) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [fill(v, sample, episode, f"{where}[{i}]", as_text) for i, v in enumerate(value)]
    if not isinstance(value, str) or "${" not in value:
        return value
    whole = REF.fullmatch(value)
    if whole and not as_text:
        return _lookup(whole.group(1), whole.group(2), sample, episode, where)
    return REF.sub(lambda m: _text(_lookup(m.group(1), m.group(2), sample, episode, where)), value)


def fill_launch(spec: Any, sample: Mapping[str, Any], episode: EpisodeVars, where: str) -> Any:
    """A copy of a ServerSpec with its launch line filled for one episode (all values text)."""
    update = {key: fill(getattr(spec, key), sample, episode, f"{where}.{key}", as_text=True)
              for key in LAUNCH_FIELDS if list(refs(getattr(spec, key)))}
    return spec.model_copy(update=update) if update else spec


def _lookup(kind: str, name: str, sample: Mapping[str, Any], episode: EpisodeVars, where: str) -> Any:
    if kind == "episode":
        value = getattr(episode, name)
        if value is None:  # not made: nothing named it when the episode opened
            raise TemplateError(f"{where}: ${{episode.{name}}} is not available here")
        return value
    node: Any = sample
    for i, part in enumerate(name.split(".")):
        if not isinstance(node, Mapping) or part not in node:
            column = ".".join(name.split(".")[:i + 1])
            keys = sorted(str(k) for k in node) if isinstance(node, Mapping) else []
            listed = ", ".join(keys[:MAX_LISTED_COLUMNS]) + (", ..." if len(keys) > MAX_LISTED_COLUMNS else "")
            raise TemplateError(f"{where} names ${{sample.{name}}}, but the sample has no column {column!r}"
                                f" (its columns: {listed or 'none'})")
        node = node[part]
    return node


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
