"""Tool manifest: the `mcpServers` file desktop MCP clients use, plus our per-server knobs.

A manifest (YAML or JSON) maps server names to how to reach them:

    mcpServers:
      calculator: {command: python, args: ["-m", "envs.servers.calculator"], timeout_s: 10}
      search: {url: "http://127.0.0.1:8000/mcp", headers: {Authorization: "Bearer ${API_KEY}"}}
      legacy: {url: "http://127.0.0.1:9000/sse", transport: sse}

Beyond the desktop shape we add, per server: `timeout_s` (per call), `startup_timeout_s` (spawn or
connect, handshake and tool list, each start and restart), `max_concurrency` (in-flight
calls; for `scope: episode`, also live episodes), `tools: {include, exclude}`, `restart` (what happens
when it crashes), `cache` (a TTL result cache for deterministic tools), `prefix` (expose tools as
`<server>__<tool>`) and the episode knobs `scope` (`shared`, or `episode`: one server per trajectory),
`pool`, `hidden_arguments` and `files` (copied into `${episode.dir}` before the server starts), whose
values may name the trajectory's sample as `${sample.<column>}` (envs.templates, envs.episode). Next to
`mcpServers`, `functions` lists plain Python functions to serve as tools (see envs.functions), or
tool classes of qwen-agent's or Agent-R1's shape (envs.tool_classes). RL-Factory's `.pydata` (a Python
literal list of `{"mcpServers": ...}` entries, never executed) and the same list in JSON are read too
(envs.manifest_formats).
`transport` (or VS Code's `type`) picks SSE over the default streamable HTTP for a `url` server;
`disabled: true` skips a server, as in Cline.

Secrets: `env` and `headers` values are never printed; see rl_factory.base.secrets for what counts as one.

How a stdio child is started (why: the SDK gives a child only HOME, PATH, ... of our env):
  * `command: python` (or `python3`) means this interpreter, `sys.executable`, so the child
    sees the same virtualenv as the trainer.
  * A relative `command` path (one with a `/`), a relative `cwd`, and (when no `cwd` is set) a relative
    argument, that names something in the manifest file's directory is made absolute there (`args:
    [server.py]` next to the manifest works from any working directory, as a function file does); any
    other relative path is passed unchanged and resolves against the trainer's working directory.
  * The child's `PYTHONPATH` is prefixed with the project root (the directory holding `envs/`), the git
    repository holding the manifest, and the trainer's own `PYTHONPATH`, after any `PYTHONPATH` the
    manifest sets. That is what makes `-m envs.servers.calculator` work from any working directory.
  * `${VAR}`, `${VAR:-default}`, `${oc.env:VAR}` and `${oc.env:VAR,default}` in any string are
    replaced from the environment when the manifest is loaded; an unset variable with no
    default is an error naming the key.

Every mistake raises `ManifestError` naming the file and the key path, e.g.
`tools.yaml: mcpServers.calc: unknown key 'comand' (did you mean 'command'?)`.
"""
from __future__ import annotations

import difflib
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import (AliasChoices, BaseModel, ConfigDict, Field, PrivateAttr, ValidationError,
                      field_validator, model_validator)

from envs.knobs import CacheSpec, RestartPolicy, cache_shorthand
from envs.launch_line import PROJECT_ROOT, git_root, listing_of, resolve_stdio
from envs.manifest_error import ManifestError
from envs.manifest_file import read_manifest_file
from rl_factory.base.secrets import Substitution, masked_mapping, protect, redact, server_secrets
from envs.templates import check_server

# Spellings users bring from other clients, normalized to the three transports we run.
TRANSPORT_ALIASES = {
    "stdio": "stdio",
    "streamable_http": "streamable_http",
    "streamable-http": "streamable_http",
    "streamableHttp": "streamable_http",
    "http": "streamable_http",
    "sse": "sse",
}
_ENV_VAR = re.compile(r"\$\{(?:oc\.env:)?([A-Za-z_][A-Za-z0-9_]*)(?:(?::-|,)([^}]*))?\}")


class ToolFilter(BaseModel):
    """Which of a server's tools the policy sees; `include` None means all of them."""

    model_config = ConfigDict(extra="forbid")
    include: list[str] | None = None
    exclude: list[str] = Field(default_factory=list)

    def keeps(self, name: str) -> bool:
        return (self.include is None or name in self.include) and name not in self.exclude


class ServerSpec(BaseModel):
    """One entry of `mcpServers`, validated; `transport` is always resolved after validation."""

    model_config = ConfigDict(extra="forbid")
    command: str | None = None
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    cwd: str | None = None
    url: str | None = None
    headers: dict[str, str] = Field(default_factory=dict)
    transport: str | None = Field(default=None, validation_alias=AliasChoices("transport", "type"))
    timeout_s: float = Field(default=30.0, gt=0)
    startup_timeout_s: float = Field(default=60.0, gt=0)
    max_concurrency: int = Field(default=64, ge=1)
    tools: ToolFilter = Field(default_factory=ToolFilter)
    restart: RestartPolicy = Field(default_factory=RestartPolicy)
    cache: CacheSpec | None = None
    prefix: bool | str = False
    # what joins the prefix and the tool's name: "__", or "-" as qwen-agent and RL-Factory name tools
    prefix_separator: Literal["__", "-"] = "__"
    disabled: bool = False
    # Episodes (envs.templates, envs.episode): one server for the run, or one per trajectory's episode
    scope: Literal["shared", "episode"] = "shared"
    # started per-episode processes kept ready (scope: episode, launch line without ${sample.*})
    pool: int = Field(default=0, ge=0)
    # tool -> argument -> value (may name ${sample.<column>}): removed from the schema the model sees,
    # filled into every call made through an episode
    hidden_arguments: dict[str, dict[str, Any]] = Field(default_factory=dict)
    # path inside ${episode.dir} -> file or directory (may name ${sample.<column>}) copied there before a
    # scope: episode server starts: a server that writes its file gets its own copy per trajectory
    files: dict[str, str] = Field(default_factory=dict)
    _secrets: tuple[str, ...] = PrivateAttr(default=())

    def redact(self, text: str) -> str:
        """`text` with this server's secrets masked: use on anything printed or logged."""
        return redact(text, self._secrets)

    def tool_prefix(self, server_name: str) -> str:
        """What goes before each tool name the model sees ('' unless `prefix` is set)."""
        if self.prefix is False:
            return ""
        return f"{server_name if self.prefix is True else self.prefix}{self.prefix_separator}"

    def __repr_args__(self):
        # Keys of env/headers say what is configured; their values may be credentials.
        for key, value in super().__repr_args__():
            if key in ("env", "headers"):
                yield key, masked_mapping(value)
            elif key in ("url", "args", "command"):
                yield key, ([self.redact(v) for v in value] if isinstance(value, list)
                            else self.redact(value) if isinstance(value, str) else value)
            else:
                yield key, value

    @field_validator("cache", mode="before")
    @classmethod
    def _cache_words(cls, value: Any) -> Any:
        return cache_shorthand(value)

    @field_validator("prefix")
    @classmethod
    def _prefix_is_a_name(cls, value: bool | str) -> bool | str:
        # The model writes `<prefix>__<tool>`: keep it to characters tool names may hold.
        if isinstance(value, str) and not re.fullmatch(r"[A-Za-z0-9_-]+", value):
            raise ValueError(f"expected true, false or a name of letters, digits, '_' and '-', got {value!r}")
        return value

    @model_validator(mode="before")
    @classmethod
    def _one_transport_key(cls, data: Any) -> Any:
        # `type` is VS Code's name for `transport`; two answers to one question is a mistake.
        if isinstance(data, dict) and "transport" in data and "type" in data:
            raise ValueError("give either 'transport' or 'type', not both")
        return data

    @field_validator("args", "env", "headers", mode="before")
    @classmethod
    def _scalars_to_str(cls, value: Any) -> Any:
        # YAML reads `--port, 8000` and `DEBUG: true` as numbers and booleans; a process wants text.
        def text(v: Any) -> Any:
            if isinstance(v, bool):
                return "true" if v else "false"
            return str(v) if isinstance(v, int | float) else v

        if isinstance(value, list):
            return [text(v) for v in value]
        if isinstance(value, dict):
            return {k: text(v) for k, v in value.items()}
        return value

    @model_validator(mode="after")
    def _resolve_transport(self) -> ServerSpec:
        if (self.command is None) == (self.url is None):
            which = "both" if self.command else "neither"
            raise ValueError(f"needs either 'command' (stdio) or 'url' (HTTP/SSE), got {which}")
        if self.transport is not None and self.transport not in TRANSPORT_ALIASES:
            raise ValueError(f"unknown transport {self.transport!r}; expected one of "
                             f"{sorted(set(TRANSPORT_ALIASES.values()))}")
        kind = TRANSPORT_ALIASES.get(self.transport or "", "stdio" if self.command else "streamable_http")
        if (kind == "stdio") != (self.command is not None):
            needs = "command" if kind == "stdio" else "url"
            raise ValueError(f"transport {self.transport!r} needs '{needs}'")
        wrong = ["args", "env", "cwd"] if self.url else ["headers"]
        for key in wrong:
            if key in self.model_fields_set:
                raise ValueError(f"'{key}' only applies to {'stdio' if self.url else 'HTTP/SSE'} servers")
        self.transport = kind
        check_server("", self)  # scope, pool, ${sample.*} / ${episode.*} references, hidden_arguments
        return self


class FunctionSpec(BaseModel):
    """One entry of `functions`: "pkg.module:fn" or "path/file.py:fn", optionally with knobs."""

    model_config = ConfigDict(extra="forbid")
    function: str
    timeout_s: float = Field(default=30.0, gt=0)
    max_concurrency: int = Field(default=64, ge=1)
    cache: CacheSpec | None = None
    # a tool class's constructor argument (qwen-agent's `cfg`; envs.tool_classes); functions take none
    cfg: dict[str, Any] | None = None

    @field_validator("cache", mode="before")
    @classmethod
    def _cache_words(cls, value: Any) -> Any:
        return cache_shorthand(value)

    def tool_prefix(self, source_name: str) -> str:
        return ""  # a function's name is its tool name

    def redact(self, text: str) -> str:
        return text  # a function gets no credentials from the manifest

    @model_validator(mode="before")
    @classmethod
    def _from_string(cls, data: Any) -> Any:
        return {"function": data} if isinstance(data, str) else data

    @field_validator("function")
    @classmethod
    def _has_colon(cls, value: str) -> str:
        target, _, name = value.rpartition(":")
        if not target or not name.isidentifier():
            raise ValueError(f"expected 'package.module:function' or 'path/file.py:function', got {value!r}")
        return value


class _ManifestModel(BaseModel):
    model_config = ConfigDict(extra="forbid")
    mcpServers: dict[str, ServerSpec] | None = None
    functions: list[FunctionSpec] = Field(default_factory=list)


@dataclass
class Manifest:
    """The enabled servers and the functions of one manifest, in file order.

    `source` names it in error messages; `base_dir` is where relative function files are looked
    up first (the manifest's directory; the cwd for a mapping); `repo` is the git repository
    holding the manifest, where "pkg.module:fn" functions are also imported from.
    """

    servers: dict[str, ServerSpec] = field(default_factory=dict)
    functions: list[FunctionSpec] = field(default_factory=list)
    source: str = "<empty>"
    base_dir: Path | None = None
    repo: Path | None = None


def load_manifest(manifest: str | os.PathLike | Mapping | None) -> Manifest:
    """Load and validate a tool manifest.

    Args:
        manifest: path to a YAML/JSON file, an already-loaded mapping (e.g. a Hydra config
            node converted to a dict), or None for a manifest with no servers.

    Returns:
        Manifest with the enabled servers; stdio commands and environments resolved.

    Raises:
        ManifestError: missing/unreadable file or any invalid key; the message names both.
    """
    if manifest is None:
        return Manifest()
    if isinstance(manifest, Mapping):
        source, raw, repo, base_dir = "<config>", dict(manifest), None, None
    else:
        path = Path(manifest)
        source, raw = str(manifest), read_manifest_file(path, _check_entry)
        repo, base_dir = git_root(path), path.resolve().parent
    substitutions: list[Substitution] = []
    raw = _interpolate(raw, source, (), substitutions)
    try:
        model = _ManifestModel.model_validate(raw)
    except ValidationError as err:
        raise ManifestError(f"{source}: {_describe(err)}") from None
    servers, listing = {}, listing_of(base_dir)
    for name, spec in (model.mcpServers or {}).items():
        if spec.disabled:
            continue
        path = ("mcpServers", name)
        spec._secrets = server_secrets(raw["mcpServers"][name], path, substitutions)
        protect(spec._secrets)
        servers[name] = resolve_stdio(spec, repo, base_dir, listing) if spec.transport == "stdio" else spec
    return Manifest(servers=servers, functions=model.functions, source=source, base_dir=base_dir, repo=repo)


def _interpolate(value: Any, source: str, path: tuple, found: list[Substitution]) -> Any:
    """Replace ${VAR}-style references in every string, recursively; record each in `found`."""
    if isinstance(value, dict):
        return {k: _interpolate(v, source, (*path, str(k)), found) for k, v in value.items()}
    if isinstance(value, list):
        return [_interpolate(v, source, (*path, i), found) for i, v in enumerate(value)]
    if not isinstance(value, str):
        return value

    def substitute(match: re.Match) -> str:
        name, default = match.group(1), match.group(2)
        if name in os.environ:
            found.append(Substitution(path, name, os.environ[name]))
            return os.environ[name]
        if default is not None:
            return default
        where = _join([f"[{p}]" if isinstance(p, int) else p for p in path])
        raise ManifestError(f"{source}: {where}: environment variable '{name}' is not set")

    return _ENV_VAR.sub(substitute, value)


def _check_entry(servers: dict[str, Any], functions: Any, where: str) -> None:
    """One entry of RL-Factory's list (envs.manifest_formats) validated as a manifest of its own."""
    try:
        _ManifestModel.model_validate({"mcpServers": servers, "functions": functions})
    except ValidationError as err:
        raise ManifestError(f"{where}: {_describe(err)}") from None


def _describe(err: ValidationError) -> str:
    """Turn pydantic's errors into `key.path: problem` lines a user can act on."""
    messages = []
    for e in err.errors():
        loc = [f"[{part}]" if isinstance(part, int) else str(part) for part in e["loc"]]
        if e["type"] == "extra_forbidden":
            parent, key = _join(loc[:-1]), loc[-1]
            known = _known_keys(loc[:-1])
            hint = difflib.get_close_matches(key, known, n=1)
            problem = f"unknown key '{key}'" + (f" (did you mean '{hint[0]}'?)" if hint else "")
            messages.append(f"{parent}: {problem}" if parent else problem)
            continue
        problem = e["msg"].removeprefix("Value error, ")
        messages.append(f"{_join(loc)}: {problem}" if loc else problem)
    return "; ".join(messages)


def _join(loc: list[str]) -> str:
    return ".".join(loc).replace(".[", "[")


def _known_keys(parent_loc: list[str]) -> list[str]:
    """The valid keys at `parent_loc`, for "did you mean" hints."""
    nested = {"tools": ToolFilter, "restart": RestartPolicy, "cache": CacheSpec}
    shapes = {(): _ManifestModel, ("mcpServers", "*"): ServerSpec, ("functions", "*"): FunctionSpec}
    shape = tuple(parent_loc[:1]) + tuple("*" for _ in parent_loc[1:2])
    model = shapes.get(shape) if len(parent_loc) <= 2 else (
        nested.get(parent_loc[2]) if len(parent_loc) == 3 else None)
    if model is None:
        return []
    return list(model.model_fields) + (["type"] if model is ServerSpec else [])


def describe_transport(spec: ServerSpec) -> str:
    """One human-readable line saying how a server is reached (for logs and the CLI)."""
    if spec.transport == "stdio":
        return spec.redact(" ".join([spec.command or "", *spec.args]))
    return f"{spec.redact(spec.url or '')} via {spec.transport}"


__all__ = ["CacheSpec", "FunctionSpec", "Manifest", "ManifestError", "RestartPolicy", "ServerSpec",
           "ToolFilter", "load_manifest",
           "describe_transport", "PROJECT_ROOT"]
