"""Entry points behind main_grpo.sh and main_eval.sh.

`python -m rl_factory.cli train key=value ...` and `python -m rl_factory.cli eval key=value ...`
compose the Hydra config and run; `--doctor` checks the setup instead (rl_factory/doctor). Relative
paths among the overrides resolve against the directory the scripts were started from
(rl_factory.paths).
Mistakes a user can make (a misspelled key, a missing file, a bad manifest, a reward that raises)
end with exit code 2 and one line naming the problem; a traceback is printed only for what looks
like a bug (set RL_FACTORY_DEBUG=1 to always see it). A run the run guard stops (a check whose action is
`stop` fired: rl_factory/guard) ends with exit code 3 and the check's line.

SIGTERM (a job scheduler, `kill`, a container stop) ends a run the way Ctrl-C does: the rollouts are
cancelled, every episode closes (its servers stop, its directory is removed), the shared servers stop,
and the exit code is 143.
"""
from __future__ import annotations

import json
import logging
import os
import signal
import sys

from rl_factory.base.errors import UserError
from rl_factory.guard import EXIT_CODE as GUARD_EXIT_CODE, GuardStop

# Mistakes in what the user gave: one line and exit 2. Every other exception is a bug and keeps its
# traceback. FileNotFoundError: a path the user named (a run directory, a checkpoint, a data file).
USER_ERRORS: tuple[type[BaseException], ...] = (UserError, FileNotFoundError)


def print_user_error(exc: BaseException) -> int:
    """The one-line error (and its cause, if any) on stderr, secrets masked; returns exit code 2."""
    from rl_factory.base.secrets import redact_known

    print(redact_known(f"error: {exc}"), file=sys.stderr)
    cause = exc.__cause__
    if cause is not None:
        print(redact_known(f"  caused by {type(cause).__name__}: {cause}"), file=sys.stderr)
    return 2


def _train_embedded(cfg, raw_overrides: list[str], print_only: str | None):
    from rl_factory.config import printable

    if print_only is not None:
        print(printable(cfg))
        return {}
    from rl_factory.trainer import train
    return train(cfg)


def _train_verl(cfg, raw_overrides: list[str], print_only: str | None):
    from rl_factory.backends.verl.launcher import train
    return train(cfg, raw_overrides, print_only)


# trainer.backend -> fn(our config, overrides that are not ours, print_only); only verl takes raw keys.
BACKENDS = {"embedded": _train_embedded, "verl": _train_verl}


def _backend_train(overrides: list[str], print_only: str | None):
    from rl_factory.config import ConfigError, load_config, split_overrides

    ours, theirs = split_overrides(overrides)
    cfg = load_config("grpo", ours)
    backend = cfg.trainer.backend
    if backend not in BACKENDS:
        raise ConfigError(f"trainer.backend: unknown backend {backend!r} (valid: {', '.join(BACKENDS)})")
    if theirs and backend != "verl":
        load_config("grpo", overrides)  # raises the usual "unknown config key ... (did you mean ...)"
    return BACKENDS[backend](cfg, theirs, print_only)


def _cfg_flag(args: list[str]) -> tuple[str | None, list[str]]:
    """Hydra's `--cfg job` (print the composed config and exit); `--resolve` resolves interpolations."""
    mode, rest, i = None, [], 0
    while i < len(args):
        arg = args[i]
        if arg == "--cfg" and i + 1 < len(args):
            mode, i = args[i + 1], i + 2
            continue
        if arg.startswith("--cfg="):
            mode = arg.split("=", 1)[1]
        elif arg != "--resolve":
            rest.append(arg)
        i += 1
    if mode is not None and mode != "job":
        from rl_factory.config import ConfigError
        raise ConfigError(f"--cfg {mode}: only --cfg job is supported")
    if mode and "--resolve" in args:
        mode = "resolve"
    return mode, rest


def _quiet_transformers() -> None:
    # Weight-loading progress bars and deprecation chatter drown the training progress bar.
    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()


def _doctor(overrides: list[str], command: str) -> int:
    """`--doctor`: check the setup without training; the table on stdout, exit 0 only if all pass."""
    from rl_factory import interrupt
    from rl_factory.doctor import run_doctor

    report = interrupt.run(run_doctor(overrides, mode=command))
    print(report.table())
    return 0 if report.ok else 1


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in ("train", "eval"):
        print("usage: python -m rl_factory.cli {train|eval} [key=value ...]", file=sys.stderr)
        return 2
    from rl_factory.paths import caller_paths

    command, overrides = argv[0], caller_paths(argv[1:])
    from rl_factory.config import load_config
    from rl_factory.run import setup_logging

    _redact_tracebacks()
    terminated = _sigterm_as_ctrl_c()
    setup_logging()
    _quiet_transformers()
    if "--doctor" in overrides:
        return _doctor([o for o in overrides if o != "--doctor"], command)
    try:
        print_only, overrides = _cfg_flag(overrides)
        if command == "train":
            summary = _backend_train(overrides, print_only)
        else:
            cfg = load_config("eval", overrides)
            if print_only is not None:
                from rl_factory.config import printable
                print(printable(cfg))
                return 0
            from rl_factory.evaluate_cli import run_eval
            summary = run_eval(cfg)
    except KeyboardInterrupt:
        print("\ninterrupted: run the same command again to resume from the last checkpoint", file=sys.stderr)
        return 143 if terminated else 130
    except USER_ERRORS as exc:
        if os.environ.get("RL_FACTORY_DEBUG"):
            raise
        return print_user_error(exc)
    except GuardStop as exc:  # a run-guard check with action `stop` fired (rl_factory/guard)
        print(f"stopped by the run guard: {exc}", file=sys.stderr)
        return GUARD_EXIT_CODE
    logging.getLogger("rl_factory").debug(json.dumps(summary, default=str))
    return 0


def _sigterm_as_ctrl_c() -> list[int]:
    """Make SIGTERM stop the run as Ctrl-C does: the running loop's main task is cancelled so that its cleanup
    runs (Python's default for SIGTERM kills the process on the spot, orphaning per-episode servers), also
    when the job started with SIGINT ignored (a background job of a script). Returns a list that holds the
    signal once one arrived."""
    from rl_factory.interrupt import request_stop

    seen: list[int] = []

    def forward(signum, frame) -> None:
        seen.append(signum)
        request_stop()

    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, forward)
    return seen


def _redact_tracebacks() -> None:
    """Uncaught tracebacks (a bug, or RL_FACTORY_DEBUG=1) are printed without the secrets we know."""
    import traceback

    from rl_factory.base.secrets import redact_known

    def hook(kind, value, tb) -> None:
        sys.stderr.write(redact_known("".join(traceback.format_exception(kind, value, tb))))

    sys.excepthook = hook


if __name__ == "__main__":
    sys.exit(main())
