"""The layer rule (DESIGN §3 and §10), checked on the source by reading every module's import statements.

Layers, bottom up:

  base                    `BASE` below: the shared leaves (types, registry, errors, secrets, the judge
                          protocol, ...). Imports no module of the project outside the base layer.
  envs, rewards           import the base layer and their own package; never each other, never the rest
                          of rl_factory (the trainer, a backend, ...).
  rl_factory.algorithms   the math (estimators, losses, tournaments): the base layer and itself only; no
                          rewards, envs, trainer or backend (building a judge is rl_factory.group_arena's).
  the rest of rl_factory  may import all of the above.

Only `rl_factory/backends/verl/` imports verl or ray (in the packages, examples/ and docsgen/; tests/ and
benchmarks/ may, to check or measure the backend against verl itself).
No two modules import each other, directly or around a longer loop.

Which import statements count: the layer rules count every one, wherever it stands (module level, under
`if TYPE_CHECKING:`, inside a function): a deferred import is still a dependency on what it imports. The
cycle rule counts the statements a module runs when it is imported: module level and try/except blocks
included, function and method bodies and `if TYPE_CHECKING:` blocks left out. An import inside a function
runs after both modules are loaded, so it cannot meet a half-initialised module, and a TYPE_CHECKING import
never runs (the annotations it serves are strings); the layer rules still see both. Imports by string (`importlib.import_module(name)`) are not seen.

Each failure lists `path:line: module imports target` for every import that breaks the rule.

`rl_factory.types` stays the public name of the data types (users' scripts import it, DESIGN §5): it
re-exports every type of `rl_factory.base.types`, and the project's own modules import the base path.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from tests.conftest import REPO_ROOT

PACKAGES = ("rl_factory", "envs", "rewards")
# The project's own top-level names: an import of one of these is an import of a project module.
PROJECT = (*PACKAGES, "examples", "benchmarks", "docsgen", "tests")
BASE = ("rl_factory.base",)
# (who, which project modules it may import, why)
LAYERS = (
    (BASE, BASE, "the base layer imports nothing of the project above it"),
    (("envs",), (*BASE, "envs"), "envs imports only the base layer and envs"),
    (("rewards",), (*BASE, "rewards"), "rewards imports only the base layer and rewards"),
    (("rl_factory.algorithms",), (*BASE, "rl_factory.algorithms"),
     "rl_factory.algorithms (the math) imports only the base layer and itself"),
)
VERL_ONLY = ("verl", "ray")
VERL_HOME = "rl_factory.backends.verl"
SCRIPT_DIRS = ("examples", "docsgen")


@dataclass(frozen=True)
class Import:
    source: str  # the importing module
    path: str  # its file, relative to the repository
    line: int
    target: str  # the imported module (a project module resolved to its file's module name)
    deferred: bool  # inside a function or method body, or under `if TYPE_CHECKING:` (never run on import)

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.source} imports {self.target}"


def under(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO_ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def project_modules() -> dict[str, Path]:
    return {module_name(p): p for package in PACKAGES for p in sorted((REPO_ROOT / package).rglob("*.py"))}


def resolve(name: str) -> str:
    """The project module `name` lives in (a.b.C -> a.b when a/b.py holds C); other names unchanged."""
    modules, probe = project_modules(), name
    while probe and probe not in modules:
        probe = probe.rpartition(".")[0]
    return probe or name


def imports_of(path: Path) -> list[Import]:
    source, rel = module_name(path), str(path.relative_to(REPO_ROOT))
    package = source if path.name == "__init__.py" else source.rpartition(".")[0]
    found: list[Import] = []

    def visit(node: ast.AST, deferred: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import):
                found.extend(Import(source, rel, child.lineno, resolve(a.name), deferred) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:  # relative: from the package, up level - 1 packages
                    anchor = package.split(".")[:len(package.split(".")) - (child.level - 1)]
                    base = ".".join([*anchor, *([child.module] if child.module else [])])
                for alias in child.names:  # `from pkg import submodule` imports the submodule
                    full = f"{base}.{alias.name}"
                    target = full if full in project_modules() else resolve(base)
                    found.append(Import(source, rel, child.lineno, target, deferred))
            visit(child, deferred or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) or _type_checking(child))

    visit(ast.parse(path.read_text(), rel), False)
    return found


@cache
def _type_checking(node: ast.AST) -> bool:
    """`if TYPE_CHECKING:` (or `typing.TYPE_CHECKING`): its imports never run."""
    if not isinstance(node, ast.If):
        return False
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def all_imports() -> tuple[Import, ...]:
    return tuple(i for path in project_modules().values() for i in imports_of(path))


def script_imports() -> list[Import]:
    paths = [p for d in SCRIPT_DIRS for p in sorted((REPO_ROOT / d).rglob("*.py"))]
    paths += sorted(REPO_ROOT.glob("*.py"))
    return [i for p in paths for i in imports_of(p)]


def test_the_scan_sees_the_imports():
    # A scan that silently found nothing would pass every rule below.
    assert len(project_modules()) > 100
    assert any(under(i.source, ("envs",)) and under(i.target, BASE) for i in all_imports())
    assert any(under(i.source, ("rl_factory.trainer",)) and under(i.target, ("rewards",)) for i in all_imports())
    assert any(i.deferred for i in all_imports())


def test_layers_import_only_what_is_below_them():
    broken = []
    for who, allowed, rule in LAYERS:
        bad = [i for i in all_imports() if under(i.source, who) and under(i.target, PROJECT)
               and not under(i.target, allowed)]
        broken += [f"{i}  ({rule})" for i in bad]
    assert not broken, "imports against the layer rule:\n" + "\n".join(dict.fromkeys(broken))


def test_only_the_verl_backend_imports_verl_or_ray():
    bad = [i for i in (*all_imports(), *script_imports())
           if under(i.target, VERL_ONLY) and not under(i.source, (VERL_HOME,))]
    lines = dict.fromkeys(map(str, bad))
    assert not bad, f"only {VERL_HOME} imports {' or '.join(VERL_ONLY)}:\n" + "\n".join(lines)


def test_no_import_cycles():
    graph: dict[str, dict[str, Import]] = {}
    for i in all_imports():
        if not i.deferred and i.target in project_modules() and i.target != i.source:
            graph.setdefault(i.source, {}).setdefault(i.target, i)
    cycles = [cycle for cycle in strongly_connected(graph) if len(cycle) > 1]
    report = []
    for cycle in cycles:
        members = set(cycle)
        report.append(" <-> ".join(sorted(cycle)) + ":")
        report += [f"  {imp}" for m in sorted(cycle)
                   for target, imp in sorted(graph.get(m, {}).items()) if target in members]
    assert not cycles, "modules that import each other (at module level):\n" + "\n".join(report)


def strongly_connected(graph: dict[str, dict[str, Import]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative (no recursion limit on a deep import chain)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, {}))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph.get(nxt, {})))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    out.append(component)
    return out


def test_rl_factory_types_is_the_public_name_of_every_base_type():
    # Users' scripts import `rl_factory.types` (DESIGN §5); the definitions live in the base layer.
    import rl_factory.base.types as base
    import rl_factory.types as public

    defined = sorted(name for name, value in vars(base).items() if not name.startswith("_")
                     and (getattr(value, "__module__", None) == base.__name__ or name.isupper()))
    assert "Trajectory" in defined
    missing = [name for name in defined if getattr(public, name, None) is not getattr(base, name)]
    assert not missing, f"rl_factory/types.py does not re-export {missing} of rl_factory.base.types"
    assert sorted(public.__all__) == defined
