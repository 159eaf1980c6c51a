"""The two test tiers: which tests are `slow` (left out of the every-change run), and the guard that keeps it so.

`.venv/bin/python -m pytest -q -m "not slow"` is the fast tier a developer runs on every change;
`.venv/bin/python -m pytest -q` (and CI) runs everything. A test is `slow` when

- its module says so (`pytestmark = pytest.mark.slow`) or the test does (`@pytest.mark.slow`): the tests that
  run a launch script or a training run, build a model of their own, or take seconds each by measurement;
- or it uses a fixture of SLOW_FIXTURES (directly or through another fixture): set here, at collection.

A test that uses the tiny model built once per test run (`tiny_model_dir`, directly or through `tokenizer` or
another fixture) is also marked `model`, so `-m "not model"` runs without building it.

The guard: while a test that is not `slow` runs (its fixtures included), starting a launch script
(`main_grpo.sh`, `main_eval.sh`, `python -m rl_factory.cli train|eval`) or a training run that returns
(`rl_factory.trainer.train`) fails that test with a line that says to mark it. So a new test that trains and
is left unmarked fails in the full run (CI) too, not only in the fast tier. What it cannot see: a launch
started by a grandchild process (a script the test runs, which runs another).
"""
from __future__ import annotations

import functools
import importlib.abc
import re
import subprocess
import sys

import pytest

# Fixtures that make a test slow wherever they are used: a training run or a Ray cluster.
SLOW_FIXTURES = ("ray_cluster", "two_steps", "verl_setup")
MODEL_FIXTURE = "tiny_model_dir"
# A launch script in a command line (a list of arguments or a shell string).
LAUNCH = re.compile(r"main_(grpo|eval)\.sh|rl_factory\.cli +(train|eval)\b")
# Functions whose return means a training run happened (a refusal raises first and stays allowed).
WATCHED = {"rl_factory.trainer": ("train",)}

_current: pytest.Item | None = None
_violations: list[str] = []


def mark_tiers(items: list[pytest.Item]) -> None:
    """Add `model` and `slow` by the fixtures each test uses (its fixture closure)."""
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        if MODEL_FIXTURE in names:
            item.add_marker(pytest.mark.model)
        if names.intersection(SLOW_FIXTURES):
            item.add_marker(pytest.mark.slow)


def _record(what: str) -> None:
    if _current is not None and _current.get_closest_marker("slow") is None:
        _violations.append(what)


def launches(args) -> bool:
    """Whether a command line (a list of arguments or a shell string) starts a launch script."""
    return _describe(args) is not None


def _describe(args) -> str | None:
    line = args if isinstance(args, (str, bytes)) else " ".join(map(str, args))
    line = line.decode() if isinstance(line, bytes) else line
    return f"starts {line[:120]!r}" if LAUNCH.search(line) else None


_popen_init = subprocess.Popen.__init__


@functools.wraps(_popen_init)
def _watched_popen_init(self, *args, **kwargs):
    what = _describe(args[0] if args else kwargs.get("args", ""))
    if what:
        _record(what)
    _popen_init(self, *args, **kwargs)


def _watched(fn, label: str):
    @functools.wraps(fn)
    def call(*args, **kwargs):
        result = fn(*args, **kwargs)
        _record(f"ran {label}() to its end")
        return result
    call.__tiers_watched__ = True
    return call


def _wrap(module) -> None:
    for name in WATCHED[module.__name__]:
        fn = getattr(module, name)
        if not getattr(fn, "__tiers_watched__", False):
            setattr(module, name, _watched(fn, f"{module.__name__}.{name}"))


class _WrapOnImport(importlib.abc.MetaPathFinder):
    """Wraps WATCHED's functions as their module is imported, before any `from module import fn` binds them
    (a test module's top-level import at collection included)."""

    def find_spec(self, fullname, path, target=None):
        if fullname not in WATCHED:
            return None
        for finder in sys.meta_path:
            spec = None if finder is self else getattr(finder, "find_spec", lambda *a: None)(fullname, path, target)
            if spec is not None and spec.loader is not None:
                break
        else:
            return None
        exec_module = spec.loader.exec_module

        def exec_and_wrap(module):
            exec_module(module)
            _wrap(module)
        spec.loader.exec_module = exec_and_wrap
        return spec


def install() -> None:
    """Start watching (pytest_configure): the subprocess launcher and WATCHED's functions."""
    subprocess.Popen.__init__ = _watched_popen_init
    for name in WATCHED:
        if name in sys.modules:
            _wrap(sys.modules[name])
    sys.meta_path.insert(0, _WrapOnImport())


def enter(item: pytest.Item | None) -> None:
    """The test whose setup, call and teardown run now (None between tests)."""
    global _current
    _current = item
    _violations.clear()


def check(item: pytest.Item) -> None:
    """Fail a test that is not `slow` but started a launch script or a training run (its setup included)."""
    if _violations:
        found = "; ".join(dict.fromkeys(_violations))
        _violations.clear()
        pytest.fail(f"{item.nodeid} is not marked slow but {found}: mark it `@pytest.mark.slow` (or its module "
                    f"`pytestmark = pytest.mark.slow`); tests/tiers.py says why", pytrace=False)
