"""`python -m rl_factory.report RUN_DIR [RUN_DIR ...] [-o report.html]`: write the HTML report of runs.

Exit codes: 0 written; 2 a directory that holds no run, printed as one line.
"""
from __future__ import annotations

import argparse
import sys

from rl_factory.report import REPORT_FILE, write_report
from rl_factory.report.trajectories import DEFAULT_MAX_TRAJECTORIES


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rl_factory.report",
                                     description="Write one self-contained HTML report (curves and a trajectory "
                                                 "browser) of one or more run directories; several runs are overlaid.")
    parser.add_argument("runs", nargs="+", help="run directories (trainer.output_dir) or main_eval.sh output directories")
    parser.add_argument("-o", "--out", help=f"the HTML file (default: <first run>/{REPORT_FILE})")
    parser.add_argument("--max-trajectories", type=int, default=DEFAULT_MAX_TRAJECTORIES,
                        help="trajectories embedded for the browser (default %(default)s)")
    parser.add_argument("--title", help="page title (default: the run names)")
    args = parser.parse_args(argv)
    try:
        out = write_report(args.runs, args.out, max_trajectories=args.max_trajectories,
                           progress=sys.stderr.isatty(), title=args.title)
    except FileNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"report: {out.resolve()}  (open it in a browser; it works offline)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
