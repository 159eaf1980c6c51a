"""The error an unusable tool manifest raises, wherever it is found (reading the file, converting another project's
format, validating the servers and functions); envs.manifest re-exports it."""
from __future__ import annotations

from rl_factory.base.errors import UserError


class ManifestError(UserError, ValueError):
    """An unusable tool manifest; the message names the file and the offending key."""
