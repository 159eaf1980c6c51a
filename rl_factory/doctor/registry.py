"""The doctor's check registry: each check registers in the order it runs, with the state keys it needs and gives.

A check reads what earlier ones left in `doctor.state` and adds what later ones need (`needs` names the
keys, `gives` the ones it adds); a check whose keys are missing is skipped, and its row names the checks
that give them.
"""
from __future__ import annotations

from typing import Any

CHECKS: list[tuple[str, Any, tuple[str, ...]]] = []
GIVEN_BY: dict[str, str] = {}  # state key -> the check that puts it there


class CheckFailed(Exception):
    def __init__(self, detail: str, fix: str = ""):
        super().__init__(detail)
        self.detail, self.fix = detail, fix


def check(name: str, needs: tuple[str, ...] = (), gives: tuple[str, ...] = ()):
    def register(fn):
        CHECKS.append((name, fn, needs))
        GIVEN_BY.update(dict.fromkeys(gives, name))
        return fn
    return register


def skipped(missing: list[str]) -> str:
    """A skipped check's row, in the words of the table: the checks that had to pass first."""
    names = list(dict.fromkeys(GIVEN_BY.get(key, key) for key in missing))
    listed = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]
    return f"not run: needs the {listed} check{'s' if len(names) > 1 else ''} to pass"


def one_line(exc: BaseException) -> str:
    """The exception's message on one line (a KeyError's without the quotes its str adds)."""
    text = exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)
    return " ".join(str(text).split())[:400]
