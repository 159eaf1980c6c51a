"""`bash main_grpo.sh --doctor [overrides]` / `bash main_eval.sh --doctor`: check a setup in seconds.

Without loading weights or training, in order (a check whose inputs failed is skipped, not run):

    config          the config composes and every slice and registry name is valid; on verl, verl's config
                    composed and checked as verl would (backends/verl/validate.py), no model built, no Ray
    run directory   (training) a fresh directory, the same run to resume, or another run (refused)
    data            the rows load, and every row has the columns the reward names
    environment     (env.environment only) the class loads, its hooks are async, reset of the first row
                    returns messages (rendered with that row's prompt by "tool schemas")
    tools           every manifest server starts and lists its tools (none: single-turn, or the
                    environment drives the turns)
    reward          the reward loads and scores one row (the reference answer as the completion; with an
                    environment, played as one turn: reset, the answer, step, so `state` is what it made of it;
                    a reward that reads `tools` is said to see the episode before any call)
    chat template   the model's tokenizer has a chat template that ends turns with its eos token
    tool schemas    the schemas render through the template, and the longest prompt fits
    parser          the parser reads back the calls the template writes (rl_factory/doctor/template.py)
    token stream    the tokens we train on equal the template's rendering of the same conversation

It prints a table with the fix for each failure and exits 0 only if every check passed.
"""
from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

PASS, FAIL, SKIP = "pass", "fail", "skip"


@dataclass
class CheckResult:
    name: str
    status: str
    detail: str
    fix: str = ""
    seconds: float = 0.0


@dataclass
class Report:
    checks: list[CheckResult] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(c.status == PASS for c in self.checks)

    def table(self) -> str:
        width = max(len(c.name) for c in self.checks)
        lines = [f"{'check':<{width}}  result  detail", f"{'-' * width}  ------  {'-' * 40}"]
        for c in self.checks:
            first, *more = c.detail.split("\n")  # a detail's further lines: a server's stderr, indented
            lines.append(f"{c.name:<{width}}  {c.status.upper():<6}  {first}")
            lines.extend(f"{'':<{width}}  {'':<6}  {line}" for line in more)
            if c.fix:
                lines.append(f"{'':<{width}}  {'':<6}  fix: {c.fix}")
        failed = [c.name for c in self.checks if c.status == FAIL]
        lines.append("all checks passed" if self.ok else
                     f"{len(failed)} check(s) failed: {', '.join(failed)}" +
                     ("" if not any(c.status == SKIP for c in self.checks) else " (skipped checks depend on them)"))
        return "\n".join(lines)


class Doctor:
    """Runs the checks in order; each is a method that fills `self.state` for the ones after it."""

    def __init__(self, overrides: list[str], mode: str = "train"):
        self.overrides, self.mode = overrides, mode
        self.state: dict[str, Any] = {}
        self.report = Report()

    async def run(self) -> Report:
        from rl_factory.doctor import checks, model_checks, registry  # noqa: F401 (importing registers, in order)

        for name, fn, needs in registry.CHECKS:
            if name == "run directory" and self.mode != "train":
                continue
            missing = [n for n in needs if n not in self.state]
            if missing:
                self.report.checks.append(CheckResult(name, SKIP, registry.skipped(missing)))
                continue
            await self._run_one(name, fn)
        return self.report

    async def _run_one(self, name: str, fn: Callable[[Doctor], Awaitable[str | None]]) -> None:
        from rl_factory.doctor.registry import CheckFailed, one_line

        t0 = time.perf_counter()
        try:
            detail = await fn(self)
            if detail is None:  # nothing to check for this setup (e.g. no env.environment): no row
                return
            status, fix = PASS, ""
        except CheckFailed as exc:
            status, detail, fix = FAIL, exc.detail, exc.fix
        except Exception as exc:  # a check must report, never crash the doctor
            status, detail, fix = FAIL, f"{type(exc).__name__}: {one_line(exc)}", ""
        self.report.checks.append(CheckResult(name, status, detail, fix, time.perf_counter() - t0))


async def run_doctor(overrides: list[str], mode: str = "train") -> Report:
    """Run every check for the config `overrides` compose to (`mode`: train or eval)."""
    doctor = Doctor(overrides, mode)
    try:
        return await doctor.run()
    finally:
        env = doctor.state.pop("env", None)
        if env is not None:
            await env.__aexit__(None, None, None)
