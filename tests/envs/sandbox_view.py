"""What a sandboxed run sees of the host, as the sandbox tests expect it."""
import os
import sys
from pathlib import Path


def sandbox_tmp_listing() -> str:
    """What `os.listdir('/tmp')` prints in a fresh sandbox run: nothing, except the first component of an
    interpreter or venv that lives under /tmp (bound read-only at its own path so that it runs there)."""
    prefixes = {sys.prefix, sys.base_prefix, os.path.realpath(sys.executable)}
    return str(sorted({Path(p).relative_to("/tmp").parts[0] for p in prefixes if p.startswith("/tmp/")}))
