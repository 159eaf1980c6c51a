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

Sample values are data, never syntax, in a launch line (a dataset row must not steer where the
server runs or which credentials go where):
  * in `url`, each `${sample.*}` value is percent-encoded (`/`, `:`, `@`, `?`, `#` included), so it
    cannot change the scheme, host, port or path the manifest wrote around it;
  * an `args` entry that begins with a sample value may not begin with `-` (it would be read as an
    option), and one that begins with `${episode.dir}` must stay inside that directory (`../`);
  * a `cwd` that names a sample value must resolve inside `${episode.dir}`;
  * a `headers` value may not hold a line break or a NUL.
A value that breaks one of these refuses that sample (`TemplateError`, the episode's one-line error).
"""
from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

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
    check_files(spec)


def check_files(spec: Any) -> None:
    """`files`: per-episode copies, so only on a `scope: episode` server, each to a path inside ${episode.dir}."""
    if spec.files and spec.scope != "episode":
        raise ValueError("files are copied into each episode's ${episode.dir}: they need scope: episode")
    if spec.files and spec.pool:
        raise ValueError("pool starts processes before their episode exists, so before its files are copied; "
                         "drop pool, or files")
    for target, source in spec.files.items():
        parts = target.replace("\\", "/").split("/")
        if not target or target.startswith("/") or ".." in parts or "${" in target:
            raise ValueError(f"files: {target!r}: expected a relative path inside ${{episode.dir}} (no '..', no "
                             "references), e.g. db.sqlite")
        for kind, ref in refs(source):
            if kind == "episode":
                raise ValueError(f"files.{target}: a source may name ${{sample.*}}, not ${{episode.{ref}}}")


def needs_dir(values: Any) -> bool:
    """Whether `values` (a ServerSpec's launch line, or a mapping such as hidden_arguments) names ${episode.dir}
    (a `cwd` naming the sample needs it too: it must resolve inside it)."""
    if hasattr(values, "model_copy"):
        return (("episode", "dir") in set(launch_refs(values)) or any(k == "sample" for k, _ in refs(values.cwd))
                or bool(values.files))
    return ("episode", "dir") in set(refs(values))


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
    """A copy of a ServerSpec with its launch line filled for one episode (all values text).

    Raises:
        TemplateError: a missing column, or a sample value the launch line may not take (module docstring).
    """
    update = {}
    for key in LAUNCH_FIELDS:
        value = getattr(spec, key)
        if not list(refs(value)):
            continue
        if key == "url":
            update[key] = REF.sub(lambda m: _url_part(m, sample, episode, f"{where}.url"), value)
        else:
            update[key] = fill(value, sample, episode, f"{where}.{key}", as_text=True)
    for i, (template, filled) in enumerate(zip(spec.args, update.get("args", ()))):
        _check_arg(template, filled, episode, f"{where}.args[{i}]")
    if "cwd" in update and any(kind == "sample" for kind, _ in refs(spec.cwd)):
        if not episode.dir or not _inside(update["cwd"], episode.dir):
            raise TemplateError(f"{where}.cwd: {spec.cwd} gives {update['cwd']!r:.120}, outside the episode's "
                                "directory ${episode.dir}; a cwd that names the sample must be inside it")
    for name, text in (update.get("headers") or {}).items():
        if any(c in text for c in "\r\n\0"):  # a second header, or a request of its own
            raise TemplateError(f"{where}.headers.{name}: the sample's value holds a line break or NUL")
    return spec.model_copy(update=update) if update else spec


def copy_files(spec: Any, sample: Mapping[str, Any], episode: EpisodeVars, where: str) -> None:
    """Copy each of the server's `files` into the episode's directory (before its instance starts).

    Raises:
        TemplateError: a missing column, or a source that does not exist.
    """
    for target, source in spec.files.items():
        path = fill(source, sample, episode, f"{where}.files.{target}", as_text=True)
        if not os.path.exists(path):
            raise TemplateError(f"{where}.files.{target}: {source} is {path!r:.160}, which does not exist")
        dest = os.path.join(episode.dir, target)
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        if os.path.isdir(path):
            shutil.copytree(path, dest, symlinks=True, dirs_exist_ok=True)
        else:
            shutil.copyfile(path, dest)


def _url_part(match: re.Match, sample: Mapping[str, Any], episode: EpisodeVars, where: str) -> str:
    text = _text(_lookup(match.group(1), match.group(2), sample, episode, where))
    # a sample value is one opaque piece of the URL; ${episode.id} is hex and needs no encoding
    return quote(text, safe="") if match.group(1) == "sample" else text


def _check_arg(template: str, filled: str, episode: EpisodeVars, where: str) -> None:
    first = REF.match(template)
    if first is None:  # the entry begins with the manifest's own text, which says what it is
        return
    if first.group(1) == "sample" and filled.startswith("-"):
        raise TemplateError(f"{where}: ${{sample.{first.group(2)}}} gives {filled!r:.80}, which the server would "
                            "read as an option; a value from the sample may not begin with '-'")
    names_sample = any(kind == "sample" for kind, _ in refs(template))
    if first.group(0) == "${episode.dir}" and names_sample and episode.dir:
        if not _inside(filled, episode.dir):
            raise TemplateError(f"{where}: {template} gives {filled!r:.120}, outside the episode's directory")


def _inside(path: str, directory: str) -> bool:
    real, root = os.path.realpath(path), os.path.realpath(directory)
    return real == root or real.startswith(root + os.sep)


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
