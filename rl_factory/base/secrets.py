"""Secrets in a tool manifest: which strings are secret, and scrubbing them from what we print.

API keys reach a server through its `env` (stdio) or `headers` (HTTP/SSE), usually as `${VAR}`.
A server's secrets are:
  * every `headers` value (headers in an MCP config are there to authenticate) and every `env`
    value whose key looks secret (`API_KEY`, `HF_TOKEN`, `DB_PASSWORD`, ...); for a value like
    `Bearer abc123` also the credential after the scheme;
  * every value `${VAR}` interpolation put into `env` or `headers` (whatever the variable's name:
    the environment is where keys live);
  * the value of any secret-looking `${VAR}` used elsewhere in the entry (a token in a URL or
    an argument).
Error messages, the CLI and `repr(ServerSpec)` go through `redact`, which replaces each secret
with `***`. Logs too, including other libraries' (the MCP SDK logs the URL it connects to at
DEBUG level): loading a manifest registers its secrets with a log-record factory that scrubs
every record's message in this process (`protect`).

Values shorter than MIN_SECRET_CHARS are not treated as secrets: masking "1" or "on" everywhere
would garble messages and protect nothing.

The run's config gets the same care (see "Configs" below): an inline manifest's `${oc.env:VAR}`
references are kept as text and resolved by the manifest loader, so `--cfg job`, config.yaml and
the config handed to verl (whose TaskRunner prints it) show `${oc.env:VAR}`, never the value; a
secret-looking `${oc.env:VAR}` elsewhere is printed as that reference too, and other secret-named
values as `***`. Everything we write besides (rollouts, tool logs, log records and their
tracebacks, error lines) goes through `redact_known`.
"""
from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

SECRET_NAME = re.compile(r"key|token|secret|passw|auth|credential|cookie|session|private|bearer", re.I)
MIN_SECRET_CHARS = 6
MASK = "***"
# Entry keys whose values are handed to the server as credentials.
CREDENTIAL_FIELDS = ("env", "headers")
# Computed by us, never secret, and useful when a server fails to import.
NOT_SECRET_ENV = frozenset({"PYTHONPATH"})


@dataclass(frozen=True)
class Substitution:
    """One `${VAR}` replaced while loading: where (key path), which variable, what value."""

    path: tuple[str, ...]
    var: str
    value: str


def looks_secret(name: str) -> bool:
    return bool(SECRET_NAME.search(name))


def server_secrets(entry: Mapping, path: tuple[str, ...],
                   substitutions: Iterable[Substitution]) -> tuple[str, ...]:
    """The secret strings of one manifest entry at `path` (after interpolation), longest first."""
    found: set[str] = set()
    for field in CREDENTIAL_FIELDS:
        values = entry.get(field)
        if not isinstance(values, Mapping):
            continue
        for key, value in values.items():
            # Headers in an MCP config are there to authenticate, so all of them count.
            if isinstance(value, str) and (field == "headers" or looks_secret(str(key))):
                found.add(value)
                found.add(value.split()[-1] if value.split() else value)  # "Bearer <token>"
    for sub in substitutions:
        if sub.path[:len(path)] != path:
            continue
        inside_credentials = len(sub.path) > len(path) and sub.path[len(path)] in CREDENTIAL_FIELDS
        if inside_credentials or looks_secret(sub.var):
            found.add(sub.value)
    return tuple(sorted((s for s in found if len(s) >= MIN_SECRET_CHARS), key=len, reverse=True))


def redact(text: str, secrets: Iterable[str]) -> str:
    """`text` with every secret replaced by `***` (longest first, so no secret leaks in part)."""
    for secret in secrets:
        if secret in text:
            text = text.replace(secret, MASK)
    return text


def masked_mapping(values: Mapping[str, str]) -> dict[str, str]:
    """For reprs: keys kept (they say what is configured), values hidden."""
    return {k: v if k in NOT_SECRET_ENV else MASK for k, v in values.items()}


# Every secret known to this process (manifests loaded, secret `${oc.env:VAR}` values of the config),
# longest first, with what replaces it: `***`, or the `${oc.env:VAR}` it came from.
_protected: tuple[tuple[str, str], ...] = ()


def protect(secrets: Iterable[str], replacement: str = MASK) -> None:
    """Scrub `secrets` from every log record created from now on (whoever logs it, tracebacks
    included) and from whatever `redact_known` is given."""
    global _protected
    known = dict(_protected)
    new = {s: replacement for s in secrets if len(s) >= MIN_SECRET_CHARS and s not in known}
    if not new:
        return
    if not _protected:
        _install_record_factory()
    _protected = tuple(sorted({**known, **new}.items(), key=lambda item: len(item[0]), reverse=True))


def redact_known(text: str) -> str:
    """`text` with every secret this process knows replaced (see `protect`)."""
    for secret, replacement in _protected:
        if secret in text:
            text = text.replace(secret, replacement)
    return text


def safe_cut(data: bytes, extra: Iterable[str] = ()) -> int:
    """Where to cut `data` (a long line written in pieces, each scrubbed on its own) so that no secret
    (`extra` or one `protect` knows) is split between two pieces: the last (longest secret - 1) bytes are
    held back, for a secret that the next bytes may complete, and the cut moves before any secret that
    spans it, and off a UTF-8 continuation byte. The bytes from the cut on go into the next piece."""
    secrets = [s.encode("utf-8", "replace") for s in (*extra, *(s for s, _ in _protected)) if s]
    longest = max(map(len, secrets), default=1)
    cut, moved = max(0, len(data) - (longest - 1)), True
    while moved:
        moved = False
        for secret in secrets:
            start = data.rfind(secret, max(0, cut - len(secret) + 1), cut + len(secret) - 1)
            if start != -1 and start < cut < start + len(secret):
                cut, moved = start, True
    while 0 < cut < len(data) and data[cut] & 0xC0 == 0x80:
        cut -= 1
    return cut


def _install_record_factory() -> None:
    previous = logging.getLogRecordFactory()
    formatter = logging.Formatter()

    def scrubbing_factory(*args, **kwargs) -> logging.LogRecord:
        record = previous(*args, **kwargs)
        message = record.getMessage()
        clean = redact_known(message)
        if clean != message:
            record.msg, record.args = clean, ()
        if record.exc_info and record.exc_info[0] is not None:
            # Formatters use a ready exc_text as is: format the traceback now, scrubbed.
            record.exc_text = redact_known(formatter.formatException(record.exc_info))
        if record.stack_info:
            record.stack_info = redact_known(record.stack_info)
        return record

    logging.setLogRecordFactory(scrubbing_factory)


# ---- configs ----------------------------------------------------------------------------------

ENV_REF = re.compile(r"\$\{oc\.env:([A-Za-z_][A-Za-z0-9_]*)(?:,[^}]*)?\}")
# Config keys whose values are secrets: the whole name, or its last "_"/"-" part ("max_total_tokens"
# and "api_key_env", the *name* of a variable, are not).
SECRET_KEY = re.compile(r"^(.*[_-])?(api[_-]?key|token|secret|password|passwd|authorization|bearer|"
                        r"access[_-]?key)$", re.I)
INLINE_MANIFEST = ("env", "tools")  # where an inline manifest sits in the run's config


def is_credential_path(path: tuple[str, ...]) -> bool:
    """`mcpServers.<server>.env.<KEY>` or `.headers.<Name>`: where servers get their credentials."""
    return len(path) >= 4 and path[-4] == "mcpServers" and path[-2] in CREDENTIAL_FIELDS


def note_config_secrets(raw: Any) -> None:
    """Register the secret `${oc.env:VAR}` values of an *unresolved* config container.

    A reference counts when its variable looks secret, or it sits under a secret-named key or in an
    inline manifest's `env`/`headers`. Its value is then shown as `${oc.env:VAR}` wherever we print.
    """
    for path, value in _leaves(raw):
        if not isinstance(value, str) or "${oc.env:" not in value:
            continue
        sensitive = is_credential_path(path) or bool(path and SECRET_KEY.search(path[-1]))
        for match in ENV_REF.finditer(value):
            name = match.group(1)
            if (sensitive or looks_secret(name)) and os.environ.get(name):
                protect([os.environ[name]], replacement="${oc.env:%s}" % name)


def keep_env_refs(raw: Any) -> Any:
    """An inline manifest (a container) with its `${oc.env:VAR}` escaped, so that OmegaConf keeps
    them as text (`\\${...}`) and the manifest loader resolves them where the tools are opened."""
    return _map_strings(raw, lambda s: re.sub(r"(?<!\\)\$\{oc\.env:", r"\\${oc.env:", s))


def unescape_env_refs(raw: Any) -> Any:
    """The inverse of `keep_env_refs`, for display."""
    return _map_strings(raw, lambda s: s.replace("\\${oc.env:", "${oc.env:"))


def redact_config(data: Any, path: tuple[str, ...] = ()) -> Any:
    """A resolved config container safe to print or write: secret-named values and inline-manifest
    credentials masked (`***`, or the `${oc.env:VAR}` they came from), known secrets replaced in
    every other string."""
    if isinstance(data, Mapping):
        return {k: redact_config(v, (*path, str(k))) for k, v in data.items()}
    if isinstance(data, list):
        return [redact_config(v, path) for v in data]
    if not isinstance(data, str) or not data:
        return data
    known = redact_known(data)
    secret_here = is_credential_path(path) or bool(path and SECRET_KEY.search(path[-1]))
    if secret_here and known == data and "${oc.env:" not in data:
        return MASK
    return known


def for_workers(data: Any) -> Any:
    """An *unresolved* config container to hand to processes that print it (verl's TaskRunner prints
    the resolved config): each known secret value becomes the escaped `${oc.env:VAR}` reference it
    came from, and references to secret variables are escaped, so printing shows the reference and
    the value is read from the environment where it is used (by the manifest loader, or by OmegaConf
    once the worker has resolved its copy).
    Literal credentials have no variable to point to: they are masked, with a warning naming the key."""
    names = {r[len("${oc.env:"):-1] for _, r in _protected if r.startswith("${oc.env:")}

    def scrub(path: tuple[str, ...], text: str) -> str:
        for secret, replacement in _protected:
            if secret in text:
                if replacement == MASK:
                    logging.getLogger(__name__).warning(
                        "%s: a literal credential cannot be handed to worker processes without being "
                        "printed; give it as ${oc.env:VAR} (masked here)", ".".join(path))
                text = text.replace(secret, "\\" + replacement if replacement != MASK else MASK)
        return ENV_REF.sub(lambda m: "\\" + m.group(0) if m.group(1) in names else m.group(0),
                           re.sub(r"\\(?=\$\{oc\.env:)", "", text))

    return _map_strings(data, None, scrub)


def _leaves(data: Any, path: tuple[str, ...] = ()):
    if isinstance(data, Mapping):
        for k, v in data.items():
            yield from _leaves(v, (*path, str(k)))
    elif isinstance(data, list):
        for v in data:
            yield from _leaves(v, path)
    else:
        yield path, data


def _map_strings(data: Any, fn=None, with_path=None, path: tuple[str, ...] = ()) -> Any:
    if isinstance(data, Mapping):
        return {k: _map_strings(v, fn, with_path, (*path, str(k))) for k, v in data.items()}
    if isinstance(data, list):
        return [_map_strings(v, fn, with_path, path) for v in data]
    if isinstance(data, str):
        return with_path(path, data) if with_path else fn(data)
    return data
