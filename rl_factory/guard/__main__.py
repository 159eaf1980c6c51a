"""`python -m rl_factory.guard replay <bundle>`: rerun the check a bundle recorded, on the step it recorded.

The check is rebuilt from the bundle's config slice and its state before that step, and run on the step's
data (step.json). It prints the check's line and exits 3 when the violation reproduces, 0 when the check
passes (after a change to the check, or to the bundle's inputs), 2 on a directory that is not a bundle.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rl_factory.guard import EXIT_CODE


def replay(bundle: Path) -> int:
    from rl_factory.guard.bundle import load_check

    try:
        check, data, recorded = load_check(bundle)
    except (OSError, ValueError, KeyError) as exc:
        print(f"error: {bundle} is not a guard bundle ({type(exc).__name__}: {exc})", file=sys.stderr)
        return 2
    metrics, finding = check.evaluate(data)
    print(json.dumps(metrics, sort_keys=True, default=str))
    if finding is None:
        print(f"guard: {check.name} at step {data.step}: passes (the run recorded: {recorded.get('message')})")
        return 0
    print(finding.line())
    return EXIT_CODE


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rl_factory.guard", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    rerun = sub.add_parser("replay", help="rerun the failing check of a bundle (<run>/guard/step_N_<check>)")
    rerun.add_argument("bundle", type=Path)
    args = parser.parse_args(argv)
    return replay(args.bundle)


if __name__ == "__main__":
    sys.exit(main())
