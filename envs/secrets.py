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
"""
from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

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


_protected: tuple[str, ...] = ()  # every secret of every manifest loaded in this process


def protect(secrets: Iterable[str]) -> None:
    """Scrub `secrets` from every log record created from now on, whoever logs it."""
    global _protected
    new = set(secrets) - set(_protected)
    if not new:
        return
    if not _protected:
        _install_record_factory()
    _protected = tuple(sorted({*_protected, *new}, key=len, reverse=True))


def _install_record_factory() -> None:
    previous = logging.getLogRecordFactory()

    def scrubbing_factory(*args, **kwargs) -> logging.LogRecord:
        record = previous(*args, **kwargs)
        message = record.getMessage()
        clean = redact(message, _protected)
        if clean != message:
            record.msg, record.args = clean, ()
        return record

    logging.setLogRecordFactory(scrubbing_factory)
