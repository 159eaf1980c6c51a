"""Every third-party module the shipped packages import is a declared dependency (core or an extra).

A module that only arrives with something else (httpx with huggingface_hub, mcp_types with mcp) works
until that something else stops bringing it: declare what is imported, or import what is declared.
"""
import ast
import importlib.metadata
import re
import sys

import pytest

from tests.conftest import REPO_ROOT

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

PACKAGES = ("rl_factory", "envs", "rewards")


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _declared() -> set[str]:
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    specs = [*project["dependencies"], *(s for extra in project["optional-dependencies"].values() for s in extra)]
    return {_normalized(re.match(r"[A-Za-z0-9_.-]+", s).group(0)) for s in specs}


def _imported() -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for package in PACKAGES:
        for path in (REPO_ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                for name in names:
                    top = name.split(".")[0]
                    if top not in sys.stdlib_module_names and top not in (*PACKAGES, "__future__"):
                        found.setdefault(top, set()).add(str(path.relative_to(REPO_ROOT)))
    return found


def test_every_imported_module_is_declared():
    declared, distributions = _declared(), importlib.metadata.packages_distributions()
    undeclared = {module: sorted(files)[:3] for module, files in _imported().items()
                  if not {_normalized(d) for d in distributions.get(module, [module])} & declared}
    assert undeclared == {}, f"imported but not declared in pyproject.toml: {undeclared}"
