"""The errors that mean "what you gave is wrong": a config value, a file, a manifest, a reward, a model.

The entry points (rl_factory/cli.py) print a `UserError` as one line and exit 2; anything else is a
bug and keeps its traceback. Bottom layer with `types`, `registry` and `imports` (no imports), so
that `envs`, `rewards` and `rl_factory.algorithms` raise these too.
"""
from __future__ import annotations


class UserError(Exception):
    """Base of every error that names a mistake in the user's config, data, tools, reward or model."""


class ConfigError(UserError, ValueError):
    """A config key is unknown, missing or has a value of the wrong type."""


class UnknownName(UserError, KeyError):
    """A name no registry holds; the message lists the valid ones."""

    def __str__(self) -> str:  # the message itself, not KeyError's repr of it
        return str(self.args[0]) if self.args else ""
