"""Importing user code given as a file path ("my_reward.py:fn", a manifest's "tools.py:fn")."""
from __future__ import annotations

import hashlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType


def import_file(path: Path, prefix: str) -> ModuleType:
    """Run the file at `path` as a module, once per process; exceptions from its code propagate.

    The module's name comes from its resolved path, so two files called tools.py (or reward.py) in
    different folders never collide. It is registered in sys.modules before it runs, because
    dataclasses, pydantic and pickling look a class's module up there, and removed if it raises.
    """
    path = path.resolve()
    name = f"{prefix}_{path.stem}_{hashlib.sha1(str(path).encode()).hexdigest()[:10]}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module
