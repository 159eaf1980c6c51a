"""One clean console: a library's deprecation warnings go to train.log only, and each warning is said once."""
import logging
import warnings

from rl_factory.run import setup_logging

LIBRARY = "/opt/venv/lib/python3.11/site-packages/transformers/generation/utils.py"
DEPRECATION = "`past_key_values` as a tuple is deprecated and will be removed"


def warn_from(filename: str, message: str, category=FutureWarning) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.warn_explicit(message, category, filename, 1)


def test_library_deprecations_reach_train_log_but_not_the_console(tmp_path, capsys):
    setup_logging()
    warn_from(LIBRARY, DEPRECATION)  # before the run directory exists: kept for train.log
    setup_logging(tmp_path / "train.log")
    warn_from(LIBRARY, DEPRECATION + " (again)")
    warn_from(LIBRARY, "a library's own UserWarning", UserWarning)  # not a deprecation: shown
    assert "past_key_values" not in capsys.readouterr().err
    log = (tmp_path / "train.log").read_text()
    assert log.count(DEPRECATION) == 2 and "FutureWarning" in log
    assert "UserWarning" not in log  # shown as Python shows it (here: pytest's summary of warnings)


def test_each_warning_is_printed_once_and_logged_every_time(tmp_path, capsys):
    setup_logging()
    log = logging.getLogger("rl_factory")
    for _ in range(2):
        log.warning("no row has the answer column 'answer'")
    log.warning("another warning")
    setup_logging(tmp_path / "train.log")
    log.warning("no row has the answer column 'answer'")  # a restart of logging keeps what was said
    log.info("info lines are never held back")
    log.info("info lines are never held back")
    err = capsys.readouterr().err
    assert err.count("no row has the answer column") == 1 and err.count("another warning") == 1
    assert err.count("info lines are never held back") == 2
    assert (tmp_path / "train.log").read_text().count("no row has the answer column") == 3


def test_a_new_run_in_the_same_process_says_its_warnings_again(capsys):
    setup_logging()
    logging.getLogger("rl_factory").warning("said by the first run")
    setup_logging()  # what the entry point does at the start of each run
    logging.getLogger("rl_factory").warning("said by the first run")
    assert capsys.readouterr().err.count("said by the first run") == 2
