"""Writing a file whole or not at all.

A run can be killed at any instruction (SIGKILL, a preempted node), and a reader (a resume, the report,
a second process) must then find either the old content or the new, never half of it. So every file
that is rewritten in place goes to a temporary sibling first and is renamed over the old one: a rename
within a directory is atomic on POSIX. The temporary name carries the pid, so two processes writing the
same file (verl's launcher and its TaskRunner both write the start-up record) never share one.
"""
from __future__ import annotations

import os
from pathlib import Path


def write_atomic(path: str | os.PathLike, text: str, errors: str = "strict") -> None:
    """Replace `path`'s content with `text` (UTF-8, `errors` as `str.encode` takes it) in one rename; the old
    file stays, and no temporary file is left, if anything fails."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8", errors=errors)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
