"""The manifest's `functions:` entries imported and made tools: a plain function becomes a `FunctionTool`
(envs/functions.py), a tool class of qwen-agent's or Agent-R1's shape a `ClassTool` (envs/tool_classes.py).
A ManifestError names the entry that fails."""
from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from envs.functions import FunctionTool, _describe
from envs.manifest import PROJECT_ROOT, Manifest, ManifestError
from envs.tool_classes import QWEN_AGENT_TARGET, class_tool, is_tool_object, registered_tool
from rl_factory.base.imports import import_file


def load_function_tools(manifest: Manifest) -> list[FunctionTool]:
    """Import every function of the manifest; ManifestError names the entry that fails."""
    tools = []
    for i, spec in enumerate(manifest.functions):
        where = f"{manifest.source}: functions[{i}] ({spec.function!r})"
        try:
            fn = load_function(spec.function, manifest.base_dir, import_roots=[manifest.repo, PROJECT_ROOT])
        except ManifestError as err:
            raise ManifestError(f"{where}: {err}") from None
        try:
            tool = class_tool(spec, fn)
            if tool is None and spec.cfg is not None:
                raise ManifestError(f"{spec.function}: cfg is for tool classes; a function takes none")
            tools.append(tool or FunctionTool(spec, fn))
        except ManifestError as err:
            raise ManifestError(f"{where}: {str(err).split(': ', 1)[-1]}") from None
    return tools


def load_function(ref: str, base_dir: Path | None = None,
                  import_roots: Sequence[Path | None] = ()) -> Callable[..., Any]:
    """"pkg.module:fn" or "path/file.py:fn" -> the function; ManifestError says what is wrong.

    `import_roots` are appended to sys.path (lowest priority, so nothing is shadowed): the same
    roots a stdio server gets on its PYTHONPATH, so `examples.x.tools:fn` imports from any cwd.
    """
    target, _, name = ref.rpartition(":")
    if target == QWEN_AGENT_TARGET:
        return registered_tool(name)
    for root in import_roots:
        if root is not None and str(root) not in sys.path:
            sys.path.append(str(root))
    try:
        module = _import_file(target, base_dir) if target.endswith(".py") else importlib.import_module(target)
    except ManifestError:
        raise
    except Exception as exc:  # noqa: BLE001 - user code may raise anything on import
        raise ManifestError(f"cannot import {target!r}: {_describe(exc)}") from None
    fn = getattr(module, name, None)
    if not callable(fn) and not is_tool_object(fn):
        raise ManifestError(f"{target!r} has no function {name!r}")
    return fn


def _import_file(target: str, base_dir: Path | None):
    candidates = [base_dir / target] if base_dir is not None and not Path(target).is_absolute() else []
    path = next((p for p in [*candidates, Path(target)] if p.is_file()), None)
    if path is None:
        looked = ", ".join(str(p.resolve()) for p in [*candidates, Path(target)])
        raise ManifestError(f"file not found: {target} (looked at {looked})")
    return import_file(path, "_rlf_tools")
